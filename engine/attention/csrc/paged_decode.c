/* Decode attention straight from the paged KV cache (CPU), so no gathered copy of K/V is made.
 *
 * Layouts (T = float or bf16 as uint16):
 *   q        [B, H, D]            one query token per sequence
 *   kv_cache [2, KVH, S, D]       K then V, head-major; slot = block * block_size + offset
 *   tables   [B, max_blocks]      int32 block ids
 *   ctx_lens [B]                  int32 tokens in the cache, the query's own included
 *   out      [B, H, D]
 * window > 0: a sliding layer, each query sees its last `window` tokens (itself included);
 * softcap > 0: scores -> softcap * tanh(scores / softcap) before the softmax (Gemma 2);
 * sinks     [H] fp32 or NULL   attention-sink logits (gpt-oss): one more logit in each head's
 *                             softmax denominator, with no value.
 * Work item = (sequence, kv head): its G = H / KVH query heads read each K and V row once.
 * Two passes: scores for every token (fp32), softmax, then the weighted sum of V (fp32).
 * Built with -ffast-math (vectorised expf and reductions): every value here is finite. */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../../models/csrc/bf16.h"

/* token t's cache slot; block_size is a power of two (CacheConfig), so no division (an integer
 * division a token cost as much as the rest of its scores) */
static inline long slot_of(const int32_t *table, int t, int block_size) {
    if (block_size & (block_size - 1)) return (long)table[t / block_size] * block_size + t % block_size;
    const int shift = __builtin_ctz(block_size);
    return ((long)table[t >> shift] << shift) | (t & (block_size - 1));
}

/* Rows are prefetched AHEAD tokens before their use: a decode step's K/V comes from memory (it is
 * larger than the caches), and a thread that asks for a row only when it needs it waits on memory
 * (at 40 rows of 100-600 tokens, fp32, 30 layers: about 1.4 times faster with the prefetches). */
#define AHEAD 16
static inline void prefetch_row(const void *base, const int32_t *table, int t, int h, long S, int D, int block_size,
                                int elem) {
    const char *row = (const char *)base + ((long)h * S + slot_of(table, t, block_size)) * D * elem;
    for (int i = 0; i < D * elem; i += 64) __builtin_prefetch(row + i, 0, 3);
}

#define MAX_D 256
#define MAX_G 16

#define DEFINE_KERNEL(NAME, T, LOAD, STORE)                                                          \
    void NAME(const T *restrict q, const T *restrict kv, const int32_t *restrict tables,             \
              const int32_t *restrict ctx_lens, T *restrict out, int B, int H, int KVH, int D,        \
              long S, int block_size, int max_blocks, float scale, int window, float softcap,         \
              const float *restrict sinks, int num_threads) {                                         \
        const int G = H / KVH;                                                                       \
        const T *K = kv;                                                                             \
        const T *V = kv + (long)KVH * S * D;                                                         \
        _Pragma("omp parallel for schedule(dynamic, 1) num_threads(num_threads)")                   \
        for (long item = 0; item < (long)B * KVH; item++) {                                          \
            const int b = item / KVH, h = item % KVH, L = ctx_lens[b];                               \
            const int t0 = window > 0 && L > window ? L - window : 0; /* first visible token */      \
            float qf[MAX_G][MAX_D], acc[MAX_G][MAX_D];                                               \
            float *scores = malloc(sizeof(float) * (size_t)G * L);                                   \
            for (int g = 0; g < G; g++)                                                              \
                for (int d = 0; d < D; d++) {                                                        \
                    qf[g][d] = LOAD(q[((long)b * H + h * G + g) * D + d]) * scale;                    \
                    acc[g][d] = 0.f;                                                                 \
                }                                                                                    \
            const int32_t *table = tables + (long)b * max_blocks;                                    \
            for (int t = t0; t < L; t++) {                                                           \
                long slot = slot_of(table, t, block_size);                                          \
                const T *k = K + ((long)h * S + slot) * D;                                           \
                if (t + AHEAD < L) prefetch_row(K, table, t + AHEAD, h, S, D, block_size, sizeof(T)); \
                for (int g = 0; g < G; g++) {                                                        \
                    float s = 0.f;                                                                   \
                    _Pragma("omp simd reduction(+ : s)")                                             \
                    for (int d = 0; d < D; d++) s += qf[g][d] * LOAD(k[d]);                          \
                    if (softcap > 0.f) s = softcap * tanhf(s / softcap);                             \
                    scores[(long)g * L + t] = s;                                                     \
                }                                                                                    \
            }                                                                                        \
            for (int g = 0; g < G; g++) {                                                            \
                float *sg = scores + (long)g * L, m = -FLT_MAX, sum = 0.f;                            \
                const float sink = sinks ? sinks[h * G + g] : -FLT_MAX;                              \
                for (int t = t0; t < L; t++) m = sg[t] > m ? sg[t] : m;                              \
                if (sinks) { m = sink > m ? sink : m; sum = expf(sink - m); }                        \
                for (int t = t0; t < L; t++) { sg[t] = expf(sg[t] - m); sum += sg[t]; }              \
                for (int t = t0; t < L; t++) sg[t] /= sum;                                           \
            }                                                                                        \
            for (int t = t0; t < L; t++) {                                                           \
                long slot = slot_of(table, t, block_size);                                          \
                const T *v = V + ((long)h * S + slot) * D;                                           \
                if (t + AHEAD < L) prefetch_row(V, table, t + AHEAD, h, S, D, block_size, sizeof(T)); \
                for (int g = 0; g < G; g++) {                                                        \
                    float p = scores[(long)g * L + t];                                               \
                    _Pragma("omp simd")                                                              \
                    for (int d = 0; d < D; d++) acc[g][d] += p * LOAD(v[d]);                         \
                }                                                                                    \
            }                                                                                        \
            for (int g = 0; g < G; g++)                                                              \
                for (int d = 0; d < D; d++)                                                          \
                    out[((long)b * H + h * G + g) * D + d] = STORE(acc[g][d]);                        \
            free(scores);                                                                            \
        }                                                                                            \
    }

#define IDENT(x) (x)
DEFINE_KERNEL(paged_decode_window_f32, float, IDENT, IDENT)
DEFINE_KERNEL(paged_decode_window_bf16_generic, uint16_t, bf16_to_f32, f32_to_bf16)
#include "paged_decode_bf16.h"
#include "paged_prefill_bf16.h"

/* Full attention, no soft-capping, no sinks (what the one-call decode forward calls). */
void paged_decode_f32(const float *q, const float *kv, const int32_t *tables, const int32_t *ctx_lens,
                      float *out, int B, int H, int KVH, int D, long S, int block_size, int max_blocks,
                      float scale, int num_threads) {
    paged_decode_window_f32(q, kv, tables, ctx_lens, out, B, H, KVH, D, S, block_size, max_blocks, scale,
                            0, 0.f, NULL, num_threads);
}

int paged_decode_limits(int *max_d, int *max_g) {
    *max_d = MAX_D;
    *max_g = MAX_G;
    return 0;
}

void paged_decode_bf16(const uint16_t *q, const uint16_t *kv, const int32_t *tables, const int32_t *ctx_lens,
                       uint16_t *out, int B, int H, int KVH, int D, long S, int block_size, int max_blocks,
                       float scale, int num_threads) {
    paged_decode_window_bf16(q, kv, tables, ctx_lens, out, B, H, KVH, D, S, block_size, max_blocks, scale,
                             0, 0.f, NULL, num_threads);
}

/* A step's new K and V rows into the cache, in one call where two index_copy_ each paid torch's
 * dispatch and indexing (a decode step at 40 rows: 60 of them, about a tenth of the step's host
 * time): k, v [T, KVH, D] with rows `k_stride` / `v_stride` elements apart (views into the fused
 * QKV output), heads D apart; kv_cache [2, KVH, S, D]; slots [T] int64; elem: bytes per value. */
void kv_write(const char *restrict k, const char *restrict v, long k_stride, long v_stride,
              const int64_t *restrict slots, char *restrict kv, int T, int KVH, int D, long S, int elem) {
    const size_t row = (size_t)D * elem;
    char *K = kv, *V = kv + (long)KVH * S * D * elem;
    for (int t = 0; t < T; t++)
        for (int h = 0; h < KVH; h++) {
            const long dst = ((long)h * S + slots[t]) * D * elem;
            memcpy(K + dst, k + ((long)t * k_stride + (long)h * D) * elem, row);
            memcpy(V + dst, v + ((long)t * v_stride + (long)h * D) * elem, row);
        }
}
