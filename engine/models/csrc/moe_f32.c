/* A mixture-of-experts layer's experts in one call (fp32, CPU): every active expert's gated MLP
 * over the tokens routed to it, and the weighted sum back into each token's row.
 *
 * The step's routing comes sorted by expert (engine/models/moe.py): pair p = (token rows[p],
 * routing weight weights[p]); expert e owns pairs starts[e] .. starts[e + 1] - 1. Each expert's
 * gate_up [2I, H] (gate rows first) and down [H, I] are packed in the panels of f32_linear.c,
 * [E][ceil(N / NR)][K][NR]. One parallel region runs the phases with a barrier between them
 * (a call per matrix would pay two thread wake-ups and barriers per expert):
 *   1. gather the pairs' token rows: xg [P, H]
 *   2. gate_up of every (active expert, GROUP panels) work item: h [P, 2I] (each panel streamed once)
 *   3. silu(gate) * up: act [P, I]
 *   4. down of every (active expert, GROUP panels): y [P, H]
 *   5. out[t] = sum over t's pairs in ascending expert order of weights[p] * y[p] (threads split
 *      the columns, so a token's sum is in the same order in every batch)
 * An expert with few tokens (decode; 1 to 4 with AVX-512, 1 to 2 with AVX2) runs a work item
 * through `gemv_panels`, which walks its panels side by side (several streams in flight, prefetched
 * ahead, 2 * rows * panels independent FMA chains); more tokens take f32_linear.c's micro-kernel
 * panel by panel. Both keep one output as one FMA chain over k in order, so a token's result is
 * bit-identical whatever path its batch takes (the products are also the same bits in the AVX2 and
 * AVX-512 builds; their vectorized expf differs by ulps). */
#include <math.h>
#include <string.h>

#include "f32_linear.c"

#define GROUP 4 /* panels a work item */
#define PREFETCH 16 /* k steps ahead the gemv path prefetches its panels (16 x NR floats: 1-2 KiB) */
#if LANES == 16
#define GEMV_ACC 16 /* accumulators the gemv path may hold: 16 of AVX-512's 32 registers */
#else
#define GEMV_ACC 8 /* of AVX2's 16 */
#endif

/* R rows of x against G consecutive panels (pstride apart): the micro-kernel's arithmetic, lane for
 * lane, over G panels at once; channels of panel g valid: nvalid - g * NR (clipped to NR) */
static inline __attribute__((always_inline)) void gemv_panels(const float *restrict x, long ldx,
                                                              const float *restrict panels, long pstride,
                                                              const float *restrict bias, float *restrict y,
                                                              long ldy, int K, int nvalid, const int R,
                                                              const int G) {
    vec acc[4][GROUP][2];
    for (int i = 0; i < R; i++)
        for (int g = 0; g < G; g++) acc[i][g][0] = vzero(), acc[i][g][1] = vzero();
    for (int k = 0; k < K; k++) {
        vec xb[4];
        for (int i = 0; i < R; i++) xb[i] = vset1(x[i * ldx + k]);
        for (int g = 0; g < G; g++) {
            const float *w = panels + g * pstride + (long)k * NR;
            __builtin_prefetch(w + PREFETCH * NR);
#if NR * 4 > 64
            __builtin_prefetch(w + PREFETCH * NR + 16);
#endif
            const vec w0 = vload(w), w1 = vload(w + LANES);
            for (int i = 0; i < R; i++) {
                acc[i][g][0] = vfma(w0, xb[i], acc[i][g][0]);
                acc[i][g][1] = vfma(w1, xb[i], acc[i][g][1]);
            }
        }
    }
    for (int g = 0; g < G; g++) {
        const int nv = nvalid - g * NR < NR ? nvalid - g * NR : NR;
        const float *b = bias ? bias + g * NR : 0;
        for (int i = 0; i < R; i++) {
            float out[NR];
            vstore(out, acc[i][g][0]);
            vstore(out + LANES, acc[i][g][1]);
            float *yi = y + i * ldy + g * NR;
            for (int j = 0; j < nv; j++) yi[j] = out[j] + (b ? b[j] : 0.f);
        }
    }
}

/* M rows of x (K apart) against one panel into y (ldy apart), nvalid channels */
static void rows_panel(const float *restrict x, int M, int K, const float *restrict panel,
                       const float *restrict bias, float *restrict y, int ldy, int nvalid) {
    int m = 0;
#define BLOCK(R) ukernel(x + (long)m * K, K, panel, bias, y + (long)m * ldy, ldy, K, nvalid, R)
    for (; m + MR <= M; m += MR) BLOCK(MR);
    switch (M - m) {
#if MR > 7
    case 7: BLOCK(7); break;
    case 6: BLOCK(6); break;
#endif
#if MR > 5
    case 5: BLOCK(5); break;
    case 4: BLOCK(4); break;
#endif
    case 3: BLOCK(3); break;
    case 2: BLOCK(2); break;
    case 1: BLOCK(1); break;
    default: break;
    }
#undef BLOCK
}

/* M rows of x against panels q0 .. q0 + GROUP - 1 (those below `panels`) of one expert's matrix
 * (N channels, K inputs, packed from `packed`); y, bias at channel 0 */
static void rows_group(const float *restrict x, int M, int K, const float *restrict packed, int q0,
                       int panels, int N, const float *restrict bias, float *restrict y, int ldy) {
    const int q1 = q0 + GROUP < panels ? q0 + GROUP : panels;
    const long ps = (long)K * NR;
#define GEMV(R, G, q)                                                                                  \
    gemv_panels(x, K, packed + (q) * ps, ps, bias ? bias + (q) * NR : 0, y + (q) * NR, ldy, K, N - (q) * NR, \
                R, G)
#define HALVES(R) GEMV(R, GROUP / 2, q0), GEMV(R, GROUP / 2, q0 + GROUP / 2)
    if (q1 - q0 == GROUP) {
        switch (M) { /* 2 * M * panels accumulators: the whole group where they fit, else two halves */
        case 1: GEMV(1, GROUP, q0); return;
#if GEMV_ACC >= 16
        case 2: GEMV(2, GROUP, q0); return;
        case 3: HALVES(3); return;
        case 4: HALVES(4); return;
#else
        case 2: HALVES(2); return;
#endif
        default: break;
        }
    }
#undef HALVES
#undef GEMV
    for (int q = q0; q < q1; q++) {
        const int c = q * NR;
        rows_panel(x, M, K, packed + q * ps, bias ? bias + c : 0, y + c, ldy, N - c < NR ? N - c : NR);
    }
}

#define COLS 64 /* columns of the output a scatter work item owns */

void moe_f32(const float *restrict x, const long *restrict rows, const int *restrict starts,
             const float *restrict weights, const float *restrict gate_up, const float *restrict down,
             const float *restrict b_gate_up, const float *restrict b_down, float *restrict out,
             float *restrict xg, float *restrict h, float *restrict act, float *restrict y, int T, int H,
             int I, int E, int num_threads) {
    const int P = starts[E], I2 = 2 * I;
    const int PG = (I2 + NR - 1) / NR, PD = (H + NR - 1) / NR;
#pragma omp parallel num_threads(num_threads)
    {
#pragma omp for schedule(static)
        for (int p = 0; p < P; p++) memcpy(xg + (long)p * H, x + rows[p] * H, sizeof(float) * H);
#pragma omp for collapse(2) schedule(dynamic, 1)
        for (int e = 0; e < E; e++)
            for (int q = 0; q < PG; q += GROUP) {
                const int m0 = starts[e], n = starts[e + 1] - m0;
                if (!n) continue;
                rows_group(xg + (long)m0 * H, n, H, gate_up + (long)e * PG * H * NR, q, PG, I2,
                           b_gate_up ? b_gate_up + (long)e * I2 : 0, h + (long)m0 * I2, I2);
            }
#pragma omp for schedule(static)
        for (int p = 0; p < P; p++) {
            const float *g = h + (long)p * I2, *u = g + I;
            float *o = act + (long)p * I;
            for (int i = 0; i < I; i++) o[i] = g[i] / (1.f + expf(-g[i])) * u[i];
        }
#pragma omp for collapse(2) schedule(dynamic, 1)
        for (int e = 0; e < E; e++)
            for (int q = 0; q < PD; q += GROUP) {
                const int m0 = starts[e], n = starts[e + 1] - m0;
                if (!n) continue;
                rows_group(act + (long)m0 * I, n, I, down + (long)e * PD * I * NR, q, PD, H,
                           b_down ? b_down + (long)e * H : 0, y + (long)m0 * H, H);
            }
#pragma omp for schedule(static)
        for (int c0 = 0; c0 < H; c0 += COLS) {
            const int c1 = c0 + COLS < H ? c0 + COLS : H;
            for (int t = 0; t < T; t++) memset(out + (long)t * H + c0, 0, sizeof(float) * (c1 - c0));
            for (int p = 0; p < P; p++) {
                float *o = out + rows[p] * H;
                const float *yp = y + (long)p * H, w = weights[p];
                for (int c = c0; c < c1; c++) o[c] += w * yp[c];
            }
        }
    }
}
