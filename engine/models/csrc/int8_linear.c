/* Weight-only INT8 linear layer for CPU decode steps: y = x @ (q * scale)^T + bias.
 *
 * Layouts: x [M, K] fp32 (row-major), q [N, K] int8 (one row per output channel), scale [N] fp32
 * (per output channel), bias [N] fp32 or NULL, y [M, N] fp32.
 * Each weight row is read once per tile of up to MR rows of x, converted to fp32 in registers and
 * multiplied in fp32: a decode step reads a quarter of the fp32 weight bytes. Output channels are
 * split across threads. Plain C, vectorised by the compiler (-O3 -march=native -ffast-math lets
 * it reorder the sums into SIMD lanes). */
#include <stdint.h>

#define NR 4 /* weight rows per tile */
#define MR 4 /* rows of x per tile */

static inline void tile(const float *restrict x, const int8_t *restrict q, const float *restrict scale,
                        const float *restrict bias, float *restrict y, int m0, int mr, int n0, int nr, int N, int K) {
    float acc[NR][MR] = {{0}};
    for (int r = 0; r < nr; r++) {
        const int8_t *restrict w = q + (long)(n0 + r) * K;
        if (mr == MR) { /* the common full tile: fixed trip counts, vectorised over k */
            const float *x0 = x + (long)m0 * K, *x1 = x0 + K, *x2 = x1 + K, *x3 = x2 + K;
            float a0 = 0, a1 = 0, a2 = 0, a3 = 0;
            for (int k = 0; k < K; k++) {
                float wk = (float)w[k];
                a0 += wk * x0[k];
                a1 += wk * x1[k];
                a2 += wk * x2[k];
                a3 += wk * x3[k];
            }
            acc[r][0] = a0, acc[r][1] = a1, acc[r][2] = a2, acc[r][3] = a3;
        } else {
            for (int m = 0; m < mr; m++) {
                const float *xm = x + (long)(m0 + m) * K;
                float a = 0;
                for (int k = 0; k < K; k++) a += (float)w[k] * xm[k];
                acc[r][m] = a;
            }
        }
    }
    for (int m = 0; m < mr; m++)
        for (int r = 0; r < nr; r++) {
            int n = n0 + r;
            y[(long)(m0 + m) * N + n] = acc[r][m] * scale[n] + (bias ? bias[n] : 0.0f);
        }
}

void int8_linear_f32(const float *restrict x, const int8_t *restrict q, const float *restrict scale,
                     const float *restrict bias, float *restrict y, int M, int N, int K, int num_threads) {
#pragma omp parallel for schedule(static) num_threads(num_threads)
    for (int n0 = 0; n0 < N; n0 += NR) {
        int nr = N - n0 < NR ? N - n0 : NR;
        for (int m0 = 0; m0 < M; m0 += MR) {
            int mr = M - m0 < MR ? M - m0 : MR;
            tile(x, q, scale, bias, y, m0, mr, n0, nr, N, K);
        }
    }
}
