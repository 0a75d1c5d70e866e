/* A mixture-of-experts layer's experts in one call (fp32, CPU): every active expert's gated MLP
 * over the tokens routed to it, and the weighted sum back into each token's row.
 *
 * The step's routing comes sorted by expert (engine/models/moe.py): pair p = (token rows[p],
 * routing weight weights[p]); expert e owns pairs starts[e] .. starts[e + 1] - 1. Each expert's
 * gate_up [2I, H] (gate rows first) and down [H, I] are packed in the panels of f32_linear.c,
 * [E][ceil(N / NR)][K][NR]. One parallel region runs the phases with a barrier between them
 * (a call per matrix would pay two thread wake-ups and barriers per expert):
 *   1. gather the pairs' token rows: xg [P, H]
 *   2. gate_up of every (active expert, panel) work item: h [P, 2I] (each panel streamed once)
 *   3. silu(gate) * up: act [P, I]
 *   4. down of every (active expert, panel): y [P, H]
 *   5. out[t] = sum over t's pairs in ascending expert order of weights[p] * y[p] (threads split
 *      the columns, so a token's sum is in the same order in every batch)
 * The micro-kernel is f32_linear.c's: an output is one FMA chain over k, whatever the batch. */
#include <math.h>
#include <string.h>

#include "f32_linear.c"

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
#pragma omp for collapse(2) schedule(dynamic, 2)
        for (int e = 0; e < E; e++)
            for (int q = 0; q < PG; q++) {
                const int m0 = starts[e], n = starts[e + 1] - m0, c = q * NR;
                if (!n) continue;
                rows_panel(xg + (long)m0 * H, n, H, gate_up + ((long)e * PG + q) * H * NR,
                           b_gate_up ? b_gate_up + (long)e * I2 + c : 0, h + (long)m0 * I2 + c, I2,
                           I2 - c < NR ? I2 - c : NR);
            }
#pragma omp for schedule(static)
        for (int p = 0; p < P; p++) {
            const float *g = h + (long)p * I2, *u = g + I;
            float *o = act + (long)p * I;
            for (int i = 0; i < I; i++) o[i] = g[i] / (1.f + expf(-g[i])) * u[i];
        }
#pragma omp for collapse(2) schedule(dynamic, 2)
        for (int e = 0; e < E; e++)
            for (int q = 0; q < PD; q++) {
                const int m0 = starts[e], n = starts[e + 1] - m0, c = q * NR;
                if (!n) continue;
                rows_panel(act + (long)m0 * I, n, I, down + ((long)e * PD + q) * I * NR,
                           b_down ? b_down + (long)e * H + c : 0, y + (long)m0 * H + c, H,
                           H - c < NR ? H - c : NR);
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
