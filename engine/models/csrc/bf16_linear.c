/* bf16 linear layer for CPUs with AVX512-BF16 or AVX2: y = x @ w^T + bias, x, w and y in bf16, fp32 sums.
 *
 * Layouts: x [M, K] bf16 (row-major, K even); the weight w [N, K] packed once (engine/models/
 * bf16_linear.py) into panels of NR = 32 output channels with pairs of k side by side,
 * [ceil(N / NR)][K / 2][NR][2] (the last panel padded with zero channels); bias [N] bf16 or NULL;
 * y [M, N] bf16, each output rounded once from its fp32 sum (to nearest even), as oneDNN does.
 *
 * The micro-kernel is f32_linear.c's with `vdpbf16ps`: it keeps an R x 32 tile of fp32 sums in
 * 2R zmm registers (R <= MR = 8) and walks k two at a time: per pair it loads the panel's 32 x 2
 * weights (two vectors, one sequential stream per panel), broadcasts the pair (x[i, k], x[i, k+1])
 * of each row as one 32-bit word and issues two dot products per row (each adds
 * x[k] w[n, k] + x[k+1] w[n, k+1] into lane n). Threads split the panels (and blocks of MB rows).
 * With AVX2 and FMA but no AVX512-BF16 (AVX2 EPYCs) a second micro-kernel below runs the same panels
 * with fp32 FMAs; without either the library answers `bf16_linear_available() == 0` and the caller
 * takes torch's bf16 matmul.
 *
 * Where the compiler targets AMX (-march=native on Sapphire Rapids and later) the library also has
 * bf16_amx.c's tile kernel over the same panels (`bf16_amx_linear`, for calls of many rows);
 * elsewhere `bf16_amx_available() == 0`. */
#include <stdint.h>

#include "bf16.h"

#ifdef _OPENMP
#include <omp.h>
#endif
#if defined(__AMX_BF16__) && defined(__AMX_TILE__) && defined(__AVX512BF16__)
#include "bf16_amx.c"
#else
int bf16_amx_available(void) { return 0; }

void bf16_amx_linear(const uint16_t *x, const uint16_t *packed, const uint16_t *bias, uint16_t *y, int M, int N,
                     int K, int num_threads) {
    (void)x, (void)packed, (void)bias, (void)y, (void)M, (void)N, (void)K, (void)num_threads;
}
#endif

int bf16_panel_width(void) { return 32; }

#if defined(__AVX512BF16__) && defined(__AVX512F__)
#include <immintrin.h>
#include <string.h>

#define NR 32
#define MR 8
#define MB 96 /* rows of x per block (prefill): kept in L2 across the panels of a work item */
#define PREFETCH 64 /* k ahead the micro-kernel prefetches its panel (4 KiB), as f32_linear.c */

int bf16_linear_available(void) { return 1; }

/* R rows of x (ldx bf16 apart) against one panel: y[i * ldy + j] = bf16(x_i . w_j + bias[j]) */
static inline __attribute__((always_inline)) void ukernel(const uint16_t *restrict x, long ldx,
                                                          const uint16_t *restrict panel,
                                                          const uint16_t *restrict bias, uint16_t *restrict y,
                                                          long ldy, int K, int nvalid, const int R) {
    __m512 acc[MR][2];
    for (int i = 0; i < R; i++) acc[i][0] = _mm512_setzero_ps(), acc[i][1] = _mm512_setzero_ps();
    for (int k = 0; k < K; k += 2) {
        _mm_prefetch((const char *)(panel + (long)(k + PREFETCH) * NR), _MM_HINT_T0);
        _mm_prefetch((const char *)(panel + (long)(k + PREFETCH) * NR + NR), _MM_HINT_T0);
        const __m512bh w0 = (__m512bh)_mm512_loadu_si512((const void *)(panel + (long)k * NR));
        const __m512bh w1 = (__m512bh)_mm512_loadu_si512((const void *)(panel + (long)k * NR + NR));
        for (int i = 0; i < R; i++) {
            uint32_t pair;
            memcpy(&pair, x + i * ldx + k, 4);
            const __m512bh xb = (__m512bh)_mm512_set1_epi32((int)pair);
            acc[i][0] = _mm512_dpbf16_ps(acc[i][0], xb, w0);
            acc[i][1] = _mm512_dpbf16_ps(acc[i][1], xb, w1);
        }
    }
    __m512 b0 = _mm512_setzero_ps(), b1 = _mm512_setzero_ps();
    if (bias) {
        float bf[NR] = {0};
        for (int j = 0; j < nvalid; j++) bf[j] = bf16_to_f32(bias[j]);
        b0 = _mm512_loadu_ps(bf), b1 = _mm512_loadu_ps(bf + 16);
    }
    for (int i = 0; i < R; i++) {
        uint16_t out[NR];
        _mm256_storeu_si256((__m256i *)out, (__m256i)_mm512_cvtneps_pbh(_mm512_add_ps(acc[i][0], b0)));
        _mm256_storeu_si256((__m256i *)(out + 16), (__m256i)_mm512_cvtneps_pbh(_mm512_add_ps(acc[i][1], b1)));
        memcpy(y + i * ldy, out, (size_t)nvalid * 2);
    }
}

#define ROWS(R) ukernel(x + (long)m * K, K, panel, b, y + (long)m * N + n, N, K, nvalid, R)

void bf16_linear(const uint16_t *restrict x, const uint16_t *restrict packed, const uint16_t *restrict bias,
                 uint16_t *restrict y, int M, int N, int K, int num_threads) {
    const int panels = (N + NR - 1) / NR, mblocks = (M + MB - 1) / MB;
#pragma omp parallel for collapse(2) schedule(static) num_threads(num_threads)
    for (int mb = 0; mb < mblocks; mb++)
        for (int p = 0; p < panels; p++) {
            const int n = p * NR, nvalid = N - n < NR ? N - n : NR;
            const uint16_t *panel = packed + (long)p * K * NR, *b = bias ? bias + n : 0;
            const int m1 = (mb + 1) * MB < M ? (mb + 1) * MB : M;
            int m = mb * MB;
            for (; m + MR <= m1; m += MR) ROWS(MR);
            switch (m1 - m) {
            case 7: ROWS(7); break;
            case 6: ROWS(6); break;
            case 5: ROWS(5); break;
            case 4: ROWS(4); break;
            case 3: ROWS(3); break;
            case 2: ROWS(2); break;
            case 1: ROWS(1); break;
            default: break;
            }
        }
}
#elif defined(__AVX2__) && defined(__FMA__)
/* AVX2 (no bf16 instructions): the same panels and the same arithmetic, each weight widened to
 * fp32 as it is loaded. Per pair of k the panel's 64 weights are four 256-bit vectors of 8 pairs;
 * a pair's low half is w[n, k] (shifted up 16 bits it is that weight's fp32 value) and its high
 * half w[n, k+1] (masked). x is widened to fp32 once per call. A tile of R <= MR = 3 rows x 32
 * channels keeps 12 ymm sums; each output is rounded once to bf16 (nearest even). */
#include <immintrin.h>
#include <stdlib.h>
#include <string.h>

#define NR 32
#define MR 3
#define MB 96
#define PREFETCH 64

int bf16_linear_available(void) { return 1; }

static inline __attribute__((always_inline)) void ukernel(const float *restrict x, long ldx,
                                                          const uint16_t *restrict panel,
                                                          const uint16_t *restrict bias, uint16_t *restrict y,
                                                          long ldy, int K, int nvalid, const int R) {
    __m256 acc[MR][4];
    for (int i = 0; i < R; i++)
        for (int v = 0; v < 4; v++) acc[i][v] = _mm256_setzero_ps();
    const __m256i high = _mm256_set1_epi32((int)0xFFFF0000u);
    for (int k = 0; k < K; k += 2) {
        const uint16_t *pk = panel + (long)k * NR;
        _mm_prefetch((const char *)(pk + (long)PREFETCH * NR), _MM_HINT_T0);
        _mm_prefetch((const char *)(pk + (long)PREFETCH * NR + NR), _MM_HINT_T0);
        for (int v = 0; v < 4; v++) {
            const __m256i w = _mm256_loadu_si256((const __m256i *)(pk + 16 * v));
            const __m256 we = _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
            const __m256 wo = _mm256_castsi256_ps(_mm256_and_si256(w, high));
            for (int i = 0; i < R; i++) {
                acc[i][v] = _mm256_fmadd_ps(_mm256_broadcast_ss(x + i * ldx + k), we, acc[i][v]);
                acc[i][v] = _mm256_fmadd_ps(_mm256_broadcast_ss(x + i * ldx + k + 1), wo, acc[i][v]);
            }
        }
    }
    float b[NR] = {0};
    if (bias)
        for (int j = 0; j < nvalid; j++) b[j] = bf16_to_f32(bias[j]);
    for (int i = 0; i < R; i++) {
        float out[NR];
        for (int v = 0; v < 4; v++) _mm256_storeu_ps(out + 8 * v, _mm256_add_ps(acc[i][v], _mm256_loadu_ps(b + 8 * v)));
        for (int j = 0; j < nvalid; j++) y[i * ldy + j] = f32_to_bf16(out[j]);
    }
}

#define ROWS(R) ukernel(xf + (long)m * K, K, panel, b, y + (long)m * N + n, N, K, nvalid, R)

void bf16_linear(const uint16_t *restrict x, const uint16_t *restrict packed, const uint16_t *restrict bias,
                 uint16_t *restrict y, int M, int N, int K, int num_threads) {
    const int panels = (N + NR - 1) / NR, mblocks = (M + MB - 1) / MB;
    float *xf = malloc((size_t)M * K * sizeof(float));
    if (!xf) return; /* out of memory: y is left as allocated (the caller's torch.empty) */
    for (long i = 0; i < (long)M * K; i++) xf[i] = bf16_to_f32(x[i]);
#pragma omp parallel for collapse(2) schedule(static) num_threads(num_threads)
    for (int mb = 0; mb < mblocks; mb++)
        for (int p = 0; p < panels; p++) {
            const int n = p * NR, nvalid = N - n < NR ? N - n : NR;
            const uint16_t *panel = packed + (long)p * K * NR, *b = bias ? bias + n : 0;
            const int m1 = (mb + 1) * MB < M ? (mb + 1) * MB : M;
            int m = mb * MB;
            for (; m + MR <= m1; m += MR) ROWS(MR);
            switch (m1 - m) {
            case 2: ROWS(2); break;
            case 1: ROWS(1); break;
            default: break;
            }
        }
    free(xf);
}
#else
int bf16_linear_available(void) { return 0; }

void bf16_linear(const uint16_t *x, const uint16_t *packed, const uint16_t *bias, uint16_t *y, int M, int N,
                 int K, int num_threads) {
    (void)x, (void)packed, (void)bias, (void)y, (void)M, (void)N, (void)K, (void)num_threads;
}
#endif
