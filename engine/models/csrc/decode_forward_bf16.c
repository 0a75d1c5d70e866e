/* decode_forward.c's one-call decode step for bf16 models on CPUs with AVX512-BF16: every layer of
 * a Llama-family model for B decode rows, from the embeddings to the final RMSNorm, with the
 * projections in bf16_linear.c and the attention in paged_decode.c's bf16 kernel.
 *
 * The per-operator bf16 forward runs its small operators as torch ops, each rounding its result
 * to bf16; here they round at the same points (an fp32 result per element, rounded to nearest
 * even), so a row's output matches the per-operator forward's up to the summation order of the
 * RMSNorm's mean of squares (an fp32 sum; rarely one bf16 ulp apart):
 *
 *   x = bf16(x + delta); n = bf16(x * 1 / sqrt(mean(x^2) + eps)); h = bf16(w * n)     RMSNorm
 *   x' = bf16(bf16(x * cos) + bf16(swap_halves(x) * sin))                            RoPE
 *   act = bf16(bf16(silu(gate)) * up)                                                SiLU * up
 *
 * A row's result does not depend on the other rows (the linear and attention kernels compute
 * each row on its own), so a sequence's draft tokens verified as extra decode rows give exactly
 * what decoding them one at a time gives (engine/speculative). */
#include "bf16_linear.c"
#include "../../attention/csrc/paged_decode.c"
#include "decode_model.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef uint16_t bf16;

static inline float f(bf16 v) { return bf16_to_f32(v); }
static inline bf16 rb(float v) { return f32_to_bf16(v); }

static void add_rms_norm_bf16(bf16 *restrict x, const bf16 *restrict delta, const bf16 *restrict w,
                              bf16 *restrict out, int T, int C, float eps) {
    for (int t = 0; t < T; t++) {
        bf16 *xr = x + (long)t * C, *o = out + (long)t * C;
        if (delta)
            for (int c = 0; c < C; c++) xr[c] = rb(f(xr[c]) + f(delta[(long)t * C + c]));
        float ss = 0.f;
        for (int c = 0; c < C; c++) ss += f(xr[c]) * f(xr[c]);
        const float r = 1.f / sqrtf(ss / (float)C + eps);
        for (int c = 0; c < C; c++) o[c] = rb(f(w[c]) * f(rb(f(xr[c]) * r)));
    }
}

/* qk rows [T] of `heads` heads of D (row_stride apart), rotated in place at positions [T] */
static void rope_bf16(bf16 *restrict qk, const int64_t *restrict positions, const bf16 *restrict cos_table,
                      const bf16 *restrict sin_table, int T, int heads, int D, long row_stride) {
    const int half = D / 2;
    for (int t = 0; t < T; t++) {
        const bf16 *c = cos_table + positions[t] * D, *s = sin_table + positions[t] * D;
        for (int h = 0; h < heads; h++) {
            bf16 *v = qk + t * row_stride + (long)h * D;
            for (int i = 0; i < half; i++) {
                const float a = f(v[i]), b = f(v[i + half]);
                v[i] = rb(f(rb(a * f(c[i]))) + f(rb(b * f(s[i]))));
                v[i + half] = rb(f(rb(b * f(c[i + half]))) + f(rb(a * f(s[i + half]))));
            }
        }
    }
}

static void silu_mul_bf16(const bf16 *restrict gate_up, bf16 *restrict out, int T, int I) {
    for (int t = 0; t < T; t++) {
        const bf16 *g = gate_up + (long)t * 2 * I, *u = g + I;
        bf16 *o = out + (long)t * I;
        for (int i = 0; i < I; i++) {
            const float x = f(g[i]);
            o[i] = rb(f(rb(x / (1.f + expf(-x)))) * f(u[i]));
        }
    }
}

/* bf16_linear.c's kernel, or bf16_amx.c's AMX tiles for batches of the model's amx rows */
static void linear(const DecodeModel *m, const bf16 *x, const void *w, const void *bias, bf16 *y, int B, int N,
                   int K, int nt) {
    if (B >= m->amx_min_rows && B <= m->amx_max_rows && K % 32 == 0)
        bf16_amx_linear(x, w, bias, y, B, N, K, nt);
    else
        bf16_linear(x, w, bias, y, B, N, K, nt);
}

/* decode_forward's contract in bf16: x [B, hidden] the embeddings in, the residual stream out; out
 * [B, hidden] the final normed hidden states; caches [2, KVH, S, D] bf16. */
void decode_forward_bf16(const DecodeModel *m, bf16 *x, bf16 *out, const int64_t *positions,
                         const int64_t *slots, const int32_t *tables, const int32_t *ctx_lens, int B,
                         int max_blocks, int nt) {
    const int C = m->hidden, H = m->heads, KVH = m->kv_heads, D = m->head_dim, I = m->intermediate;
    const int NQKV = (H + 2 * KVH) * D;
    bf16 *h = malloc(sizeof(bf16) * B * C), *qkv = malloc(sizeof(bf16) * B * NQKV);
    bf16 *q = malloc(sizeof(bf16) * B * H * D), *attn = malloc(sizeof(bf16) * B * H * D);
    bf16 *o = malloc(sizeof(bf16) * B * C), *gu = malloc(sizeof(bf16) * B * 2 * I);
    bf16 *act = malloc(sizeof(bf16) * B * I), *delta = malloc(sizeof(bf16) * B * C);
    const bf16 *d = NULL; /* the last layer's MLP output, added by the next norm */
    for (int l = 0; l < m->layers; l++) {
        add_rms_norm_bf16(x, d, m->input_norm[l], h, B, C, m->eps);
        linear(m, h, m->qkv[l], m->qkv_bias[l], qkv, B, NQKV, C, nt);
        rope_bf16(qkv, positions, m->cos, m->sin, B, H + KVH, D, NQKV);
        bf16 *K = m->kv[l], *V = K + (long)KVH * m->cache_slots * D;
        for (int b = 0; b < B; b++) {
            const bf16 *row = qkv + (long)b * NQKV;
            memcpy(q + (long)b * H * D, row, sizeof(bf16) * H * D);
            for (int g = 0; g < KVH; g++) {
                memcpy(K + ((long)g * m->cache_slots + slots[b]) * D, row + (H + g) * D, sizeof(bf16) * D);
                memcpy(V + ((long)g * m->cache_slots + slots[b]) * D, row + (H + KVH + g) * D, sizeof(bf16) * D);
            }
        }
        paged_decode_bf16(q, K, tables, ctx_lens, attn, B, H, KVH, D, m->cache_slots, m->block_size, max_blocks,
                          m->attn_scale, nt);
        linear(m, attn, m->o[l], m->o_bias[l], o, B, C, H * D, nt);
        add_rms_norm_bf16(x, o, m->post_norm[l], h, B, C, m->eps);
        linear(m, h, m->gate_up[l], NULL, gu, B, 2 * I, C, nt);
        silu_mul_bf16(gu, act, B, I);
        linear(m, act, m->down[l], NULL, delta, B, C, I, nt);
        d = delta;
        if (m->between_layers) m->between_layers(l);
    }
    add_rms_norm_bf16(x, d, m->final_norm, out, B, C, m->eps);
    free(h), free(qkv), free(q), free(attn), free(o), free(gu), free(act), free(delta);
}
