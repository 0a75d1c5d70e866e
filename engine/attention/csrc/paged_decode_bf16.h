/* paged_decode_window_bf16: the bf16 decode kernel, with AVX512-BF16 where the CPU has it.
 *
 * The generic kernel (paged_decode.c) costs about 130 cycles per token and KV head at head_dim 64:
 * each query head converts the K row to fp32 again and sums its dot product across the vector on
 * its own. Here, for head_dim a multiple of 32:
 *   scores  one `vdpbf16ps` per 32 dims multiplies q and k exactly (a bf16 product fits in fp32)
 *           into fp32 partial sums; the partial-sum vectors of 16 tokens are reduced together by
 *           a transpose-and-add tree (`sum16`, 3 instructions a token instead of 8), and the sum is
 *           then scaled (the generic kernel scales q first: the same value where the scale is a
 *           power of two, as at head_dim 64, else within an ulp of fp32);
 *   values  each V row is converted to fp32 once (its even and odd dims apart, one instruction per
 *           16 values) and added into every query head's accumulator.
 * Softmax, window, softcap and sinks are the generic kernel's, in fp32. Elsewhere (no AVX512-BF16,
 * another head_dim) the generic kernel runs. */
#if defined(__AVX512BF16__) && defined(__AVX512F__)
#include <immintrin.h>

/* v[0..15] -> one vector whose lane i is the sum of v[i]'s 16 lanes */
static inline __m512 sum16(const __m512 v[16]) {
    __m512 x[8], y[4], z[2];
    for (int i = 0; i < 8; i++) /* lanes 0-7: v[2i]'s halves added, 8-15: v[2i+1]'s */
        x[i] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0x44),
                             _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0xEE));
    for (int i = 0; i < 4; i++) /* 128-bit block k: 4 partial sums of v[4i + k] */
        y[i] = _mm512_add_ps(_mm512_shuffle_f32x4(x[2 * i], x[2 * i + 1], 0x88),
                             _mm512_shuffle_f32x4(x[2 * i], x[2 * i + 1], 0xDD));
    for (int i = 0; i < 2; i++) /* block k: 2 partials of v[8i + k], then 2 of v[8i + 4 + k] */
        z[i] = _mm512_add_ps(_mm512_shuffle_ps(y[2 * i], y[2 * i + 1], 0x88),
                             _mm512_shuffle_ps(y[2 * i], y[2 * i + 1], 0xDD));
    /* block k: [v[k], v[4 + k], v[8 + k], v[12 + k]], i.e. lane 4k + j holds v[k + 4j] */
    const __m512 w = _mm512_add_ps(_mm512_shuffle_ps(z[0], z[1], 0x88), _mm512_shuffle_ps(z[0], z[1], 0xDD));
    const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    return _mm512_permutexvar_ps(order, w);
}

/* 16 tokens' dot products with one query head (DC = D / 32 vectors of bf16 pairs; a constant where
 * inlined at D = 64, so the 16 chains interleave) */
static inline __attribute__((always_inline)) __m512 qk16(const __m512bh *qv, const uint16_t *const krow[16],
                                                        const int DC) {
    __m512 acc[16];
    for (int j = 0; j < 16; j++) {
        __m512 a = _mm512_setzero_ps();
        for (int c = 0; c < DC; c++) a = _mm512_dpbf16_ps(a, qv[c], (__m512bh)_mm512_loadu_si512(krow[j] + c * 32));
        acc[j] = a;
    }
    return sum16(acc);
}

static inline __m512 bf16x16_to_f32(const uint16_t *p) {
    return _mm512_castsi512_ps(
        _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
}

/* out[g] (bf16, D apart) = sum over visible tokens i of p[g * L + i] * V[i], for gn <= 4 query heads:
 * each V row converted once, 32 values at a time: a 32-bit lane holding the pair (v[2j], v[2j+1]) is
 * v[2j] as fp32 once shifted left 16 bits and v[2j+1] once its low half is masked off, so the even
 * and the odd dims take one instruction each (two where widening 16 values takes a load, a zero
 * extension and a shift) and sit in accumulators of their own; each output is the same chain of
 * fp32 FMAs in token order. DP = D / 32 (a constant where inlined at D = 64: registers only). */
static inline __attribute__((always_inline)) void pv_heads(const uint16_t *restrict V,
                                                           const int32_t *restrict table,
                                                           const float *restrict p, int L, int t0, int h,
                                                           long S, int D, int block_size, int gn, const int DP,
                                                           uint16_t *restrict out) {
    __m512 even[4][MAX_D / 32], odd[4][MAX_D / 32];
    for (int g = 0; g < 4; g++)
        for (int c = 0; c < DP; c++) even[g][c] = odd[g][c] = _mm512_setzero_ps();
    const __m512i high = _mm512_set1_epi32((int)0xFFFF0000u);
    for (int i = t0; i < L; i++) {
        const uint16_t *v = V + ((long)h * S + slot_of(table, i, block_size)) * D;
        __m512 ve[MAX_D / 32], vo[MAX_D / 32];
        for (int c = 0; c < DP; c++) {
            const __m512i w = _mm512_loadu_si512(v + c * 32);
            ve[c] = _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
            vo[c] = _mm512_castsi512_ps(_mm512_and_si512(w, high));
        }
        for (int g = 0; g < 4; g++) {
            if (g >= gn) break;
            const __m512 pg = _mm512_set1_ps(p[(long)g * L + i]);
            for (int c = 0; c < DP; c++) {
                even[g][c] = _mm512_fmadd_ps(pg, ve[c], even[g][c]);
                odd[g][c] = _mm512_fmadd_ps(pg, vo[c], odd[g][c]);
            }
        }
    }
    for (int g = 0; g < gn; g++)
        for (int c = 0; c < DP; c++) { /* each sum rounded to bf16, the pairs put back together */
            const __m512i e = _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(even[g][c]));
            const __m512i o = _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(odd[g][c]));
            _mm512_storeu_si512(out + (long)g * D + c * 32, _mm512_or_si512(e, _mm512_slli_epi32(o, 16)));
        }
}

void paged_decode_window_bf16(const uint16_t *restrict q, const uint16_t *restrict kv,
                              const int32_t *restrict tables, const int32_t *restrict ctx_lens,
                              uint16_t *restrict out, int B, int H, int KVH, int D, long S, int block_size,
                              int max_blocks, float scale, int window, float softcap,
                              const float *restrict sinks, int num_threads) {
    if (D % 32) {
        paged_decode_window_bf16_generic(q, kv, tables, ctx_lens, out, B, H, KVH, D, S, block_size, max_blocks,
                                         scale, window, softcap, sinks, num_threads);
        return;
    }
    const int G = H / KVH, DC = D / 32;
    const uint16_t *K = kv, *V = kv + (long)KVH * S * D;
#pragma omp parallel for schedule(dynamic, 1) num_threads(num_threads)
    for (long item = 0; item < (long)B * KVH; item++) {
        const int b = item / KVH, h = item % KVH, L = ctx_lens[b];
        const int t0 = window > 0 && L > window ? L - window : 0; /* first visible token */
        const int32_t *table = tables + (long)b * max_blocks;
        __m512bh qv[MAX_G][MAX_D / 32];
        for (int g = 0; g < G; g++)
            for (int c = 0; c < DC; c++)
                qv[g][c] = (__m512bh)_mm512_loadu_si512(q + ((long)b * H + h * G + g) * D + c * 32);
        float *scores = malloc(sizeof(float) * (size_t)G * L);
        const __m512 vscale = _mm512_set1_ps(scale);
        int t = t0;
        for (; t + 16 <= L; t += 16) {
            const uint16_t *krow[16];
            for (int j = 0; j < 16; j++) {
                const long slot = slot_of(table, t + j, block_size);
                krow[j] = K + ((long)h * S + slot) * D;
            }
            for (int g = 0; g < G; g++) {
                const __m512 s = D == 64 ? qk16(qv[g], krow, 2) : qk16(qv[g], krow, DC);
                _mm512_storeu_ps(scores + (long)g * L + t, _mm512_mul_ps(s, vscale));
            }
        }
        for (; t < L; t++) {
            const long slot = slot_of(table, t, block_size);
            const uint16_t *k = K + ((long)h * S + slot) * D;
            for (int g = 0; g < G; g++) {
                __m512 a = _mm512_setzero_ps();
                for (int c = 0; c < DC; c++)
                    a = _mm512_dpbf16_ps(a, qv[g][c], (__m512bh)_mm512_loadu_si512(k + c * 32));
                scores[(long)g * L + t] = _mm512_reduce_add_ps(a) * scale;
            }
        }
        for (int g = 0; g < G; g++) {
            float *sg = scores + (long)g * L, m = -FLT_MAX, sum = 0.f;
            const float sink = sinks ? sinks[h * G + g] : -FLT_MAX;
            if (softcap > 0.f)
                for (int i = t0; i < L; i++) sg[i] = softcap * tanhf(sg[i] / softcap);
#pragma omp simd reduction(max : m)
            for (int i = t0; i < L; i++) m = sg[i] > m ? sg[i] : m;
            if (sinks) { m = sink > m ? sink : m; sum = expf(sink - m); }
#pragma omp simd
            for (int i = t0; i < L; i++) sg[i] = expf(sg[i] - m);
#pragma omp simd reduction(+ : sum)
            for (int i = t0; i < L; i++) sum += sg[i];
            const float inv = 1.f / sum;
#pragma omp simd
            for (int i = t0; i < L; i++) sg[i] *= inv;
        }
        for (int g0 = 0; g0 < G; g0 += 4) { /* up to 4 query heads' accumulators in registers */
            const int gn = G - g0 < 4 ? G - g0 : 4;
            if (D == 64) pv_heads(V, table, scores + (long)g0 * L, L, t0, h, S, D, block_size, gn, 2,
                                  out + ((long)b * H + h * G + g0) * D);
            else pv_heads(V, table, scores + (long)g0 * L, L, t0, h, S, D, block_size, gn, DC,
                          out + ((long)b * H + h * G + g0) * D);
        }
        free(scores);
    }
}
#else
void paged_decode_window_bf16(const uint16_t *restrict q, const uint16_t *restrict kv,
                              const int32_t *restrict tables, const int32_t *restrict ctx_lens,
                              uint16_t *restrict out, int B, int H, int KVH, int D, long S, int block_size,
                              int max_blocks, float scale, int window, float softcap,
                              const float *restrict sinks, int num_threads) {
    paged_decode_window_bf16_generic(q, kv, tables, ctx_lens, out, B, H, KVH, D, S, block_size, max_blocks, scale,
                                     window, softcap, sinks, num_threads);
}
#endif
