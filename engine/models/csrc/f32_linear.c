/* fp32 linear layer for the CPU at small batch: y = x @ w^T + bias.
 *
 * Layouts: x [M, K] fp32 (row-major), w [N, K] fp32 (one row per output channel, the checkpoint's
 * layout: no repacking), bias [N] fp32 or NULL, y [M, N] fp32.
 * A decode step is bound by reading the weights once: threads split the output channels in blocks
 * of NB rows; inside a block, groups of four weight rows (kept in L1) meet the rows of x MR at a
 * time (an MR x 4 tile of vector accumulators: each weight vector is loaded once for MR rows, each
 * x vector once for four weight rows), and at batch 1 one row of x meets eight weight rows at a
 * time (eight independent sums hide the FMA latency). Each sum runs over K in vector lanes (16
 * with AVX-512, 8 with AVX2), then the lanes are added up. Without AVX2 + FMA the same tiles run
 * in plain C. */
#include <stdint.h>

#define NB 16 /* output channels per work item */
#define MB 64 /* rows of x per pass over a work item's weights */

#if defined(__AVX512F__)
#include <immintrin.h>
typedef __m512 vec;
#define LANES 16
#define MR 4 /* 4 x 4 accumulators + 4 weight vectors + 1 x vector of the 32 registers */
#define vload _mm512_loadu_ps
#define vfma _mm512_fmadd_ps
#define vzero _mm512_setzero_ps
#define vsum _mm512_reduce_add_ps
#define VREG(v) __asm__("" : "+v"(v))
#elif defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
typedef __m256 vec;
#define LANES 8
#define MR 2 /* 2 x 4 accumulators + 4 weight vectors + 1 x vector of the 16 registers */
#define vload _mm256_loadu_ps
#define vfma _mm256_fmadd_ps
#define vzero _mm256_setzero_ps
#define VREG(v) __asm__("" : "+x"(v))
static inline float vsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
#else
typedef float vec;
#define LANES 1
#define MR 2
#define vload(p) (*(p))
#define vfma(a, b, c) ((a) * (b) + (c))
#define vzero() 0.0f
#define vsum(v) (v)
#define VREG(v) (void)(v)
#endif

/* R rows of x (K apart) against C weight rows (K apart): y[i * ldy + j] = x_i . w_j + bias[j] */
static inline __attribute__((always_inline)) void tile(const float *restrict x, const float *restrict w,
                                                       const float *restrict bias, float *restrict y,
                                                       long ldy, int K, const int R, const int C) {
    vec acc[MR][8];
    for (int i = 0; i < R; i++)
        for (int j = 0; j < C; j++) acc[i][j] = vzero();
    int k = 0;
    for (; k + LANES <= K; k += LANES) {
        vec wv[8];
        for (int j = 0; j < C; j++) {
            wv[j] = vload(w + (long)j * K + k);
            VREG(wv[j]); /* kept in a register: gcc would otherwise reload it for every FMA */
        }
        for (int i = 0; i < R; i++) {
            vec xv = vload(x + (long)i * K + k);
            VREG(xv);
            for (int j = 0; j < C; j++) acc[i][j] = vfma(wv[j], xv, acc[i][j]);
        }
    }
    for (int i = 0; i < R; i++)
        for (int j = 0; j < C; j++) {
            float s = vsum(acc[i][j]);
            for (int t = k; t < K; t++) s += x[(long)i * K + t] * w[(long)j * K + t];
            y[i * ldy + j] = s + (bias ? bias[j] : 0.0f);
        }
}

void f32_linear(const float *restrict x, const float *restrict w, const float *restrict bias,
                float *restrict y, int M, int N, int K, int num_threads) {
#pragma omp parallel for schedule(static) num_threads(num_threads)
    for (int n0 = 0; n0 < N; n0 += NB) {
        const int n1 = N - n0 < NB ? N : n0 + NB;
        if (M == 1) {
            int n = n0;
            for (; n + 8 <= n1; n += 8) tile(x, w + (long)n * K, bias ? bias + n : 0, y + n, N, K, 1, 8);
            for (; n < n1; n++) tile(x, w + (long)n * K, bias ? bias + n : 0, y + n, N, K, 1, 1);
            continue;
        }
        for (int m0 = 0; m0 < M; m0 += MB) { /* MB rows of x stay in L2 across the block's weights */
            const int m1 = M - m0 < MB ? M : m0 + MB;
            int n = n0;
            for (; n + 4 <= n1; n += 4) { /* four weight rows, kept in L1 across the rows of x */
                const float *wn = w + (long)n * K, *bn = bias ? bias + n : 0;
                int m = m0;
                for (; m + MR <= m1; m += MR) tile(x + (long)m * K, wn, bn, y + (long)m * N + n, N, K, MR, 4);
                for (; m + 2 <= m1; m += 2) tile(x + (long)m * K, wn, bn, y + (long)m * N + n, N, K, 2, 4);
                if (m < m1) tile(x + (long)m * K, wn, bn, y + (long)m * N + n, N, K, 1, 4);
            }
            for (; n < n1; n++)
                for (int m = m0; m < m1; m++)
                    tile(x + (long)m * K, w + (long)n * K, bias ? bias + n : 0, y + (long)m * N + n, N, K, 1, 1);
        }
    }
}
