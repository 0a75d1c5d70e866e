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
 * Unlike the generic kernel's two passes (all K rows, then all V rows), one pass over chunks of 16
 * tokens with an online softmax (fp32): a chunk's K and V rows are read back to back, and the next
 * chunk's rows are prefetched a row at a time while the chunk is computed. Decode streams its K/V
 * from memory (a step's cache is larger than the caches), and a thread waits on each chunk's rows
 * unless they were asked for ahead: the prefetches let the loads overlap the arithmetic (about 1.4
 * times faster than the two passes at 40 rows of 100-600 tokens, 30 layers; benchmarks/
 * decode_attention.py). Window, softcap and sinks as in the generic kernel. Elsewhere (no
 * AVX512-BF16, another head_dim) the generic kernel runs. */
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

/* off[j] = the cache offset (elements) of head h's row of token c + j, for j in 0..15 clamped to
 * [lo, hi - 1] (the rows of tokens a chunk does not see stand in for them: read, then masked). c is a
 * multiple of 16, so where blocks hold 16 tokens or more the chunk lies in one block. */
static inline void rows16(const int32_t *table, int c, int lo, int hi, int h, long S, int D, int block_size,
                          long off[16]) {
    if (block_size >= 16) {
        const long base = (long)h * S + slot_of(table, c, block_size);
        for (int j = 0; j < 16; j++) off[j] = (base + (j < lo ? lo : j < hi ? j : hi - 1)) * D;
    } else
        for (int j = 0; j < 16; j++)
            off[j] = ((long)h * S + slot_of(table, c + (j < lo ? lo : j < hi ? j : hi - 1), block_size)) * D;
}

/* x[j] = exp(x[j]), softcap * tanh(x[j] / softcap): glibc's vector functions (libmvec) under -ffast-math */
static void exp16(float *x) {
#pragma omp simd
    for (int j = 0; j < 16; j++) x[j] = expf(x[j]);
}
static void softcap16(float *x, float softcap) {
#pragma omp simd
    for (int j = 0; j < 16; j++) x[j] = softcap * tanhf(x[j] / softcap);
}

/* acc[g] (fp32, the even dims' DP vectors then the odd dims') = acc[g] * corr[g] + sum over the 16
 * tokens j of p[g * 16 + j] * vrow[j], for gn <= 4 query heads: each V row converted once, 32 values
 * at a time (a 32-bit lane holding the pair (v[2j], v[2j+1]) is v[2j] as fp32 once shifted left 16
 * bits and v[2j+1] once its low half is masked off, one instruction each). DP = D / 32 (a constant
 * where inlined at D = 64: registers only). */
static inline __attribute__((always_inline)) void pv16(const uint16_t *const vrow[16], const float *restrict p,
                                                      const float *restrict corr, int gn, const int DP,
                                                      float *restrict acc, int stride,
                                                      const long *restrict ahead, const uint16_t *K,
                                                      const uint16_t *V) {
    __m512 even[4][MAX_D / 32], odd[4][MAX_D / 32];
    for (int g = 0; g < 4; g++) {
        if (g >= gn) break;
        const __m512 cg = _mm512_set1_ps(corr[g]);
        for (int c = 0; c < DP; c++) {
            even[g][c] = _mm512_mul_ps(cg, _mm512_loadu_ps(acc + (long)g * stride + c * 16));
            odd[g][c] = _mm512_mul_ps(cg, _mm512_loadu_ps(acc + (long)g * stride + (DP + c) * 16));
        }
    }
    const __m512i high = _mm512_set1_epi32((int)0xFFFF0000u);
    for (int j = 0; j < 16; j++) {
        __m512 ve[MAX_D / 32], vo[MAX_D / 32];
        if (ahead)
            for (int c = 0; c < DP; c++) {
                _mm_prefetch((const char *)(K + ahead[j] + c * 32), _MM_HINT_T0);
                _mm_prefetch((const char *)(V + ahead[j] + c * 32), _MM_HINT_T0);
            }
        for (int c = 0; c < DP; c++) {
            const __m512i w = _mm512_loadu_si512(vrow[j] + c * 32);
            ve[c] = _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
            vo[c] = _mm512_castsi512_ps(_mm512_and_si512(w, high));
        }
        for (int g = 0; g < 4; g++) {
            if (g >= gn) break;
            const __m512 pg = _mm512_set1_ps(p[g * 16 + j]);
            for (int c = 0; c < DP; c++) {
                even[g][c] = _mm512_fmadd_ps(pg, ve[c], even[g][c]);
                odd[g][c] = _mm512_fmadd_ps(pg, vo[c], odd[g][c]);
            }
        }
    }
    for (int g = 0; g < 4; g++) {
        if (g >= gn) break;
        for (int c = 0; c < DP; c++) {
            _mm512_storeu_ps(acc + (long)g * stride + c * 16, even[g][c]);
            _mm512_storeu_ps(acc + (long)g * stride + (DP + c) * 16, odd[g][c]);
        }
    }
}

/* A decode call's arguments, as one work item sees them */
typedef struct {
    const uint16_t *q, *K, *V;
    const int32_t *tables, *ctx_lens;
    uint16_t *out;
    int H, KVH, D, block_size, max_blocks, window;
    long S;
    float scale, softcap;
    const float *sinks;
} decode_args;

/* a work item's visible tokens: t0..L-1 */
static inline void item_span(const decode_args *a, int b, int *t0, int *L) {
    *L = a->ctx_lens[b];
    *t0 = a->window > 0 && *L > a->window ? *L - a->window : 0;
}

/* Work item (sequence b, KV head h): one pass over the visible tokens, 16 at a time (an online softmax:
 * each chunk's K and V rows are read back to back). Per query head: m the running maximum, l the
 * running sum of exp(s - m), acc the running sum of exp(s - m) * v; a chunk raising the maximum
 * rescales l and acc by exp(m_old - m_new). A sink starts m at its logit and l at 1. While a chunk is
 * computed, the next one's rows are prefetched (into L1, a row per token, so that the loads spread
 * over the chunk's work); during the last chunk, those of the first chunk of the item (nb, nh) this
 * thread takes next (nb < 0: none). */
static inline __attribute__((always_inline)) void decode_item(const decode_args *a, int b, int h, int nb, int nh,
                                                              const int DC) {
    const int D = a->D, G = a->H / a->KVH;
    const long S = a->S;
    const uint16_t *K = a->K, *V = a->V;
    int t0, L;
    item_span(a, b, &t0, &L);
    const int32_t *table = a->tables + (long)b * a->max_blocks;
    __m512bh qv[MAX_G][MAX_D / 32];
    for (int g = 0; g < G; g++)
        for (int c = 0; c < DC; c++)
            qv[g][c] = (__m512bh)_mm512_loadu_si512(a->q + ((long)b * a->H + h * G + g) * D + c * 32);
    float acc[MAX_G][MAX_D] __attribute__((aligned(64))), m[MAX_G], l[MAX_G], corr[MAX_G];
    float p[MAX_G][16] __attribute__((aligned(64)));
    for (int g = 0; g < G; g++) {
        m[g] = a->sinks ? a->sinks[h * G + g] : -FLT_MAX;
        l[g] = a->sinks ? 1.f : 0.f;
        for (int d = 0; d < D; d++) acc[g][d] = 0.f;
    }
    const __m512 vscale = _mm512_set1_ps(a->scale);
    for (int c = t0 & ~15; c < L; c += 16) { /* chunks of 16 tokens, c..c+15; visible lo..hi-1 */
        const int lo = c < t0 ? t0 - c : 0, hi = L - c < 16 ? L - c : 16;
        long off[16], ahead[16];
        int fetch = 1;
        rows16(table, c, lo, hi, h, S, D, a->block_size, off);
        if (c + 16 < L) rows16(table, c + 16, 0, L - c - 16 < 16 ? L - c - 16 : 16, h, S, D, a->block_size, ahead);
        else if (nb >= 0) {
            int nt0, nL;
            item_span(a, nb, &nt0, &nL);
            const int nc = nt0 & ~15;
            rows16(a->tables + (long)nb * a->max_blocks, nc, nt0 - nc, nL - nc < 16 ? nL - nc : 16, nh, S, D,
                   a->block_size, ahead);
        } else
            fetch = 0;
        const uint16_t *krow[16], *vrow[16];
        for (int j = 0; j < 16; j++) krow[j] = K + off[j], vrow[j] = V + off[j];
        for (int g = 0; g < G; g++) {
            const __m512 s = D == 64 ? qk16(qv[g], krow, 2) : qk16(qv[g], krow, DC);
            _mm512_store_ps(p[g], _mm512_mul_ps(s, vscale));
        }
        const __mmask16 seen = (__mmask16)(((1u << hi) - 1) & ~((1u << lo) - 1));
        for (int g = 0; g < G; g++) {
            float *sg = p[g];
            if (a->softcap > 0.f) softcap16(sg, a->softcap);
            const __m512 sv = _mm512_mask_blend_ps(seen, _mm512_set1_ps(-FLT_MAX), _mm512_load_ps(sg));
            const float mx = fmaxf(m[g], _mm512_reduce_max_ps(sv));
            _mm512_store_ps(sg, _mm512_sub_ps(sv, _mm512_set1_ps(mx)));
            exp16(sg);
            corr[g] = mx > m[g] ? expf(m[g] - mx) : 1.f;
            l[g] = l[g] * corr[g] + _mm512_reduce_add_ps(_mm512_load_ps(sg));
            m[g] = mx;
        }
        for (int g0 = 0; g0 < G; g0 += 4) { /* up to 4 query heads' accumulators in registers */
            const int gn = G - g0 < 4 ? G - g0 : 4;
            pv16(vrow, p[g0], corr + g0, gn, DC, acc[g0], MAX_D, g0 || !fetch ? NULL : ahead, K, V);
        }
    }
    for (int g = 0; g < G; g++) {
        const __m512 inv = _mm512_set1_ps(1.f / l[g]);
        uint16_t *o = a->out + ((long)b * a->H + h * G + g) * D;
        for (int c = 0; c < DC; c++) { /* each value rounded to bf16, the pairs put back together */
            const __m512 ev = _mm512_mul_ps(_mm512_loadu_ps(acc[g] + c * 16), inv);
            const __m512 od = _mm512_mul_ps(_mm512_loadu_ps(acc[g] + (DC + c) * 16), inv);
            const __m512i e = _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(ev));
            const __m512i w = _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(od));
            _mm512_storeu_si512(o + c * 32, _mm512_or_si512(e, _mm512_slli_epi32(w, 16)));
        }
    }
}

/* Work items (sequence, KV head), longest sequences first (the threads then finish together), handed
 * out through a shared counter: a thread takes its next item when it starts one, so that it can
 * prefetch that item's first rows. */
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
    const decode_args a = {.q = q, .K = kv, .V = kv + (long)KVH * S * D, .tables = tables, .ctx_lens = ctx_lens,
                           .out = out, .H = H, .KVH = KVH, .D = D, .block_size = block_size,
                           .max_blocks = max_blocks, .window = window, .S = S, .scale = scale,
                           .softcap = softcap, .sinks = sinks};
    const size_t nb = (size_t)(B > 0 ? B : 1);
    int *order = malloc(sizeof(int) * nb), *span = malloc(sizeof(int) * nb);
    for (int b = 0; b < B; b++) { /* insertion sort by visible tokens, longest first (stable) */
        int t0, L, i = b;
        item_span(&a, b, &t0, &L);
        for (; i > 0 && span[i - 1] < L - t0; i--) order[i] = order[i - 1], span[i] = span[i - 1];
        order[i] = b, span[i] = L - t0;
    }
    const long n = (long)B * KVH;
    long counter = 0;
#pragma omp parallel num_threads(num_threads)
    {
        long item = __atomic_fetch_add(&counter, 1, __ATOMIC_RELAXED);
        while (item < n) {
            const long next = __atomic_fetch_add(&counter, 1, __ATOMIC_RELAXED);
            const int b = order[item / KVH], h = item % KVH;
            const int nb = next < n ? order[next / KVH] : -1, nh = next % KVH;
            if (D == 64) decode_item(&a, b, h, nb, nh, 2);
            else decode_item(&a, b, h, nb, nh, D / 32);
            item = next;
        }
    }
    free(order), free(span);
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
