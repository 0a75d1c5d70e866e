/* A whole decode step's forward in one call: every layer of a Llama-family model for B sequences
 * that each add one token, from the embeddings to the final RMSNorm.
 *
 * The per-operator path calls the same kernels one by one from Python: at batch 1 those ~16 calls a
 * layer cost about 10 microseconds of Python and ctypes each, a third of an INT8 decode step. Here
 * the kernels run back to back in C (this file includes their sources), in the same order and with
 * the same arithmetic, so the outputs are bit-identical to the per-operator path:
 *
 *   h = RMSNorm(x += delta)                       add_rms_norm         (fused_ops.c)
 *   qkv = h W_qkv^T (+ b)                         f32_linear / int8_linear_f32
 *   RoPE on q and k in place                      rope                 (fused_ops.c)
 *   K, V rows written at each sequence's slot
 *   attn = paged decode attention                 paged_decode_f32     (attention/csrc)
 *   h = RMSNorm(x += attn W_o^T (+ b))
 *   delta = silu_mul(h W_gate_up^T) W_down^T
 *   out = RMSNorm(x += delta) after the last layer
 *
 * Only decode-only steps without LoRA on an fp32 model (weights fp32 or int8) take this path
 * (engine/models/decode.py). */
#include "f32_linear.c"
#include "int8_vnni.c" /* and int8_linear.c */
#include "fused_ops.c"
#include "../../attention/csrc/paged_decode.c"
#include "decode_model.h"

#include <string.h>

static void linear(const DecodeModel *m, const float *x, const void *w, const float *scale, const float *bias,
                   float *y, int M, int N, int K, int nt) {
    if (m->int8 == 2) int8_vnni_linear_f32(x, (const uint8_t *)w, scale, bias, y, M, N, K, nt);
    else if (m->int8) int8_linear_f32(x, (const int8_t *)w, scale, bias, y, M, N, K, nt);
    else f32_linear(x, (const float *)w, bias, y, M, N, K, nt);
}

/* x [B, hidden]: the embeddings in, the residual stream after the last layer out; out [B, hidden]
 * the final normed hidden states. positions, slots [B] int64; tables [B, max_blocks] and
 * ctx_lens [B] int32 (the new token included). */
void decode_forward(const DecodeModel *m, float *x, float *out, const int64_t *positions, const int64_t *slots,
                    const int32_t *tables, const int32_t *ctx_lens, int B, int max_blocks, int nt) {
    const int C = m->hidden, H = m->heads, KVH = m->kv_heads, D = m->head_dim, I = m->intermediate;
    const int NQKV = (H + 2 * KVH) * D;
    float *h = malloc(sizeof(float) * B * C), *qkv = malloc(sizeof(float) * B * NQKV);
    float *q = malloc(sizeof(float) * B * H * D), *attn = malloc(sizeof(float) * B * H * D);
    float *o = malloc(sizeof(float) * B * C), *gu = malloc(sizeof(float) * B * 2 * I);
    float *act = malloc(sizeof(float) * B * I), *delta = malloc(sizeof(float) * B * C);
    const float *d = NULL;  /* the last layer's MLP output, added by the next norm */
    for (int l = 0; l < m->layers; l++) {
        add_rms_norm(x, d, m->input_norm[l], h, B, C, m->eps, nt);
        linear(m, h, m->qkv[l], m->int8 ? m->qkv_scale[l] : NULL, m->qkv_bias[l], qkv, B, NQKV, C, nt);
        rope(qkv, positions, m->cos, m->sin, B, H + KVH, D, NQKV, nt);
        float *K = m->kv[l], *V = K + (long)KVH * m->cache_slots * D;
        for (int b = 0; b < B; b++) {
            const float *row = qkv + (long)b * NQKV;
            memcpy(q + (long)b * H * D, row, sizeof(float) * H * D);
            for (int g = 0; g < KVH; g++) {
                memcpy(K + ((long)g * m->cache_slots + slots[b]) * D, row + (H + g) * D, sizeof(float) * D);
                memcpy(V + ((long)g * m->cache_slots + slots[b]) * D, row + (H + KVH + g) * D, sizeof(float) * D);
            }
        }
        paged_decode_f32(q, K, tables, ctx_lens, attn, B, H, KVH, D, m->cache_slots, m->block_size, max_blocks,
                         m->attn_scale, nt);
        linear(m, attn, m->o[l], m->int8 ? m->o_scale[l] : NULL, m->o_bias[l], o, B, C, H * D, nt);
        add_rms_norm(x, o, m->post_norm[l], h, B, C, m->eps, nt);
        linear(m, h, m->gate_up[l], m->int8 ? m->gate_up_scale[l] : NULL, NULL, gu, B, 2 * I, C, nt);
        silu_mul(gu, act, B, I, nt);
        linear(m, act, m->down[l], m->int8 ? m->down_scale[l] : NULL, NULL, delta, B, C, I, nt);
        d = delta;
        if (m->between_layers) m->between_layers(l);
    }
    add_rms_norm(x, d, m->final_norm, out, B, C, m->eps, nt);
    free(h), free(qkv), free(q), free(attn), free(o), free(gu), free(act), free(delta);
}
