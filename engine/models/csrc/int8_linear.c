/* Weight-only INT8 linear layer for the CPU: y = x @ (q * scale)^T + bias.
 *
 * Layouts: x [M, K] fp32 (row-major), q [N, K] int8 (one row per output channel), scale [N] fp32
 * (per output channel), bias [N] fp32 or NULL, y [M, N] fp32.
 * Weight rows are converted to fp32 in registers, never stored dequantized: a decode step reads a
 * quarter of the fp32 weight bytes. Threads split the output channels in blocks of NB; inside a
 * block, rows of x go four at a time against one weight row (each weight value loaded once for
 * four rows), then a remaining pair against pairs of weight rows, then a last row against four
 * weight rows: always four independent sums, so the FMA latency is hidden. Plain C, vectorised by the compiler (-O3 -march=native
 * -ffast-math lets it reorder each sum into SIMD lanes). */
#include <stdint.h>

#define NB 16 /* output channels per work item */

static inline void rows4(const float *restrict x, const int8_t *restrict w, float *restrict out, int K) {
    /* four rows of x (K apart) against one weight row */
    const float *x0 = x, *x1 = x + K, *x2 = x + 2 * (long)K, *x3 = x + 3 * (long)K;
    float a0 = 0, a1 = 0, a2 = 0, a3 = 0;
    for (int k = 0; k < K; k++) {
        float wk = (float)w[k];
        a0 += wk * x0[k];
        a1 += wk * x1[k];
        a2 += wk * x2[k];
        a3 += wk * x3[k];
    }
    out[0] = a0, out[1] = a1, out[2] = a2, out[3] = a3;
}

static inline void cols4(const float *restrict x, const int8_t *restrict w, float *restrict out, int K) {
    /* one row of x against four weight rows (K apart) */
    const int8_t *w0 = w, *w1 = w + K, *w2 = w + 2 * (long)K, *w3 = w + 3 * (long)K;
    float a0 = 0, a1 = 0, a2 = 0, a3 = 0;
    for (int k = 0; k < K; k++) {
        float xk = x[k];
        a0 += (float)w0[k] * xk;
        a1 += (float)w1[k] * xk;
        a2 += (float)w2[k] * xk;
        a3 += (float)w3[k] * xk;
    }
    out[0] = a0, out[1] = a1, out[2] = a2, out[3] = a3;
}

static inline void rows2cols2(const float *restrict x, const int8_t *restrict w, float *restrict out, int K) {
    /* two rows of x against two weight rows: out = {x0.w0, x0.w1, x1.w0, x1.w1} */
    const float *x0 = x, *x1 = x + K;
    const int8_t *w0 = w, *w1 = w + K;
    float a00 = 0, a01 = 0, a10 = 0, a11 = 0;
    for (int k = 0; k < K; k++) {
        float v0 = (float)w0[k], v1 = (float)w1[k];
        a00 += v0 * x0[k];
        a01 += v1 * x0[k];
        a10 += v0 * x1[k];
        a11 += v1 * x1[k];
    }
    out[0] = a00, out[1] = a01, out[2] = a10, out[3] = a11;
}

static inline float dot1(const float *restrict x, const int8_t *restrict w, int K) {
    float a = 0;
    for (int k = 0; k < K; k++) a += (float)w[k] * x[k];
    return a;
}

void int8_linear_f32(const float *restrict x, const int8_t *restrict q, const float *restrict scale,
                     const float *restrict bias, float *restrict y, int M, int N, int K, int num_threads) {
#pragma omp parallel for schedule(static) num_threads(num_threads)
    for (int n0 = 0; n0 < N; n0 += NB) {
        const int n1 = N - n0 < NB ? N : n0 + NB;
        float acc[4];
        int m = 0;
        for (; m + 4 <= M; m += 4)
            for (int n = n0; n < n1; n++) {
                rows4(x + (long)m * K, q + (long)n * K, acc, K);
                for (int i = 0; i < 4; i++) y[(long)(m + i) * N + n] = acc[i] * scale[n] + (bias ? bias[n] : 0.0f);
            }
        if (m + 2 <= M) { /* two rows left: pairs of weight rows, each loaded once for both */
            int n = n0;
            for (; n + 2 <= n1; n += 2) {
                rows2cols2(x + (long)m * K, q + (long)n * K, acc, K);
                for (int i = 0; i < 2; i++)
                    for (int j = 0; j < 2; j++)
                        y[(long)(m + i) * N + n + j] = acc[2 * i + j] * scale[n + j] + (bias ? bias[n + j] : 0.0f);
            }
            for (; n < n1; n++)
                for (int i = 0; i < 2; i++)
                    y[(long)(m + i) * N + n] = dot1(x + (long)(m + i) * K, q + (long)n * K, K) * scale[n] + (bias ? bias[n] : 0.0f);
            m += 2;
        }
        for (; m < M; m++) {
            const float *xm = x + (long)m * K;
            int n = n0;
            for (; n + 4 <= n1; n += 4) {
                cols4(xm, q + (long)n * K, acc, K);
                for (int i = 0; i < 4; i++) y[(long)m * N + n + i] = acc[i] * scale[n + i] + (bias ? bias[n + i] : 0.0f);
            }
            for (; n < n1; n++) y[(long)m * N + n] = dot1(xm, q + (long)n * K, K) * scale[n] + (bias ? bias[n] : 0.0f);
        }
    }
}
