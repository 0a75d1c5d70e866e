/* fp32 linear layer for the CPU: y = x @ w^T + bias, over weights packed in panels.
 *
 * Layouts: x [M, K] fp32 (row-major); the weight w [N, K] packed once (engine/models/linear.py) into panels of
 * NR output channels, [ceil(N / NR)][K][NR] (channel n is panel n / NR, lane n % NR; the last
 * panel is padded with zero channels); bias [N] fp32 or NULL; y [M, N] fp32.
 *
 * The micro-kernel keeps an R x NR tile of y in vector registers (R <= MR rows of x, NR = two
 * vectors of channels) and walks k: per k it loads the panel's NR weights (contiguous: one
 * sequential stream per panel) and broadcasts x[i, k] for each of the R rows, 2R FMAs. Each lane
 * is one output channel, so every output is one fused multiply-add chain over k in order: no
 * horizontal sums, and a row's result does not depend on the batch it is in. Threads split the
 * panels (and, for long inputs, blocks of MB rows of x).
 * MR x NR: 6 x 16 with AVX2 (12 accumulators of the 16 registers), 8 x 32 with AVX-512 (16 of 32).
 * Without AVX2 + FMA the same loops run in plain C. */
#include <stdint.h>

#define MB 96 /* rows of x per block (prefill): kept in L2 across the panels of a work item */
/* k steps ahead the micro-kernel prefetches its panel into L2 (64 x NR floats: 4-8 KiB). The
 * hardware prefetcher alone keeps up with one row of x, but with several rows (a verification
 * step's k + 1) the FMAs between the loads let the stream fall behind and memory and compute add
 * up: on a 2-core Xeon, SmolLM2's projections over 5 rows take 1.5x the time of 1 row without the
 * software prefetch, 1.1-1.2x with it. */
#define PREFETCH 64 /* 32 steps into L1: about 5 % slower at 1 and 5 rows */

#if defined(__AVX512F__)
#include <immintrin.h>
typedef __m512 vec;
#define LANES 16
#define MR 8
#define vload _mm512_loadu_ps
#define vstore _mm512_storeu_ps
#define vfma _mm512_fmadd_ps
#define vzero _mm512_setzero_ps
#define vset1 _mm512_set1_ps
#elif defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
typedef __m256 vec;
#define LANES 8
#define MR 6
#define vload _mm256_loadu_ps
#define vstore _mm256_storeu_ps
#define vfma _mm256_fmadd_ps
#define vzero _mm256_setzero_ps
#define vset1 _mm256_set1_ps
#else
typedef float vec;
#define LANES 1
#define MR 4
#define vload(p) (*(p))
#define vstore(p, v) (*(p) = (v))
#define vfma(a, b, c) ((a) * (b) + (c))
#define vzero() 0.0f
#define vset1(v) (v)
#endif
#define NR (2 * LANES)

/* NR: the panel width `Linear` packs the weights with (engine/models/linear.py) */
int f32_panel_width(void) { return NR; }

/* R rows of x (ldx apart) against one panel: y[i * ldy + j] = x_i . w_j + bias[j], j < nvalid */
static inline __attribute__((always_inline)) void ukernel(const float *restrict x, long ldx,
                                                          const float *restrict panel, const float *restrict bias,
                                                          float *restrict y, long ldy, int K, int nvalid,
                                                          const int R) {
    vec acc[MR][2];
    for (int i = 0; i < R; i++) acc[i][0] = vzero(), acc[i][1] = vzero();
    for (int k = 0; k < K; k++) {
        __builtin_prefetch(panel + (long)(k + PREFETCH) * NR, 0, 2); /* into L2 (T1) */
        __builtin_prefetch(panel + (long)(k + PREFETCH) * NR + LANES, 0, 2);
        const vec w0 = vload(panel + (long)k * NR), w1 = vload(panel + (long)k * NR + LANES);
        for (int i = 0; i < R; i++) {
            const vec xb = vset1(x[i * ldx + k]);
            acc[i][0] = vfma(w0, xb, acc[i][0]);
            acc[i][1] = vfma(w1, xb, acc[i][1]);
        }
    }
    for (int i = 0; i < R; i++) {
        float out[NR];
        vstore(out, acc[i][0]);
        vstore(out + LANES, acc[i][1]);
        float *yi = y + i * ldy;
        for (int j = 0; j < nvalid; j++) yi[j] = out[j] + (bias ? bias[j] : 0.f);
    }
}

#define ROWS(R) ukernel(x + (long)m * K, K, panel, b, y + (long)m * N + n, N, K, nvalid, R)

void f32_linear(const float *restrict x, const float *restrict packed, const float *restrict bias,
                float *restrict y, int M, int N, int K, int num_threads) {
    const int panels = (N + NR - 1) / NR, mblocks = (M + MB - 1) / MB;
#pragma omp parallel for collapse(2) schedule(static) num_threads(num_threads)
    for (int mb = 0; mb < mblocks; mb++)
        for (int p = 0; p < panels; p++) {
            const int n = p * NR, nvalid = N - n < NR ? N - n : NR;
            const float *panel = packed + (long)p * K * NR, *b = bias ? bias + n : 0;
            const int m1 = (mb + 1) * MB < M ? (mb + 1) * MB : M;
            int m = mb * MB;
            for (; m + MR <= m1; m += MR) ROWS(MR);
            switch (m1 - m) {
#if MR > 7
            case 7: ROWS(7); break;
            case 6: ROWS(6); break;
#endif
#if MR > 5
            case 5: ROWS(5); break;
            case 4: ROWS(4); break;
#endif
            case 3: ROWS(3); break;
            case 2: ROWS(2); break;
            case 1: ROWS(1); break;
            default: break;
            }
        }
}
