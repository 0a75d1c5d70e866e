/* paged_prefill_bf16: causal attention of bf16 prefill chunks over the paged cache (AVX512-BF16).
 *
 * Layouts (bf16 as uint16):
 *   q        [T, H, D]        the step's packed query rows; chunk c's are rows start .. start + n - 1
 *   kv_cache [2, KVH, S, D]   K then V, the chunk's own K/V already written
 *   chunks   [C, 3]           int32 (start row, new tokens n, context length L = cached prefix + n)
 *   tables   [C, max_blocks]  int32 block ids
 *   out      [T, H, D]        only the chunks' rows are written
 * Query i of a chunk sits at position L - n + i and sees keys 0 .. its position (the last `window`
 * of them where window > 0); softcap and sinks as in the decode kernel.
 *
 * Work item = (chunk, KV head, block of 16 query positions), its G = H / KVH query heads together,
 * so each K/V row is read once per item. One vector lane = one query position (q transposed once
 * per item into pairs of dims), which keeps every step lane-wise:
 *   scores  per key, D / 2 `vdpbf16ps` of the packed queries with the key's dim pair broadcast:
 *           16 queries' exact bf16 products summed in fp32, then scaled;
 *   softmax online over tiles of 16 keys (flash-style): running max and sum per lane, in fp32;
 *   values  each V row converted to fp32 once per tile, its entries broadcast into fp32 FMAs with
 *           the tile's probabilities (fp32: no rounding of the probabilities to bf16).
 * The output is rounded to bf16 once. Items run largest first (OpenMP dynamic). */
#define PF_Q 16 /* query positions per item: one vector's lanes */
#define PF_K 16 /* keys per tile */
#define PF_NEG (-1e30f) /* below any score; finite (-ffast-math) */

#if defined(__AVX512BF16__) && defined(__AVX512F__)
#include <immintrin.h>

int paged_prefill_bf16_supported(int D) { return D % 32 == 0 && D <= MAX_D; }

/* e^x within 2 ulp of fp32 over the range that matters here (x <= 0; clamped to [-87, 88]): 2^n
 * by vscalefps and e^r, |r| <= ln(2) / 2, by its Taylor polynomial to r^7 (inlined: a libm call
 * per vector spills every register around it) */
static inline __m512 pf_exp(__m512 x) {
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.f)), _mm512_set1_ps(88.f));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x); /* ln 2 in two parts */
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187045e-6f), r);
    __m512 p = _mm512_set1_ps(1.f / 5040);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 720));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 120));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 24));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 6));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f));
    return _mm512_scalef_ps(p, n);
}

/* acc[j] (lane r) = q_r . k_j for the tile's keys; qp: [D / 2] vectors of query dim pairs */
static inline __attribute__((always_inline)) void pf_scores(const __m512i *qp, const uint16_t *const krow[PF_K],
                                                           const int DP, __m512 acc[PF_K]) {
    for (int j = 0; j < PF_K; j++) acc[j] = _mm512_setzero_ps();
    for (int c = 0; c < DP; c++) {
        const __m512bh qv = (__m512bh)_mm512_load_si512(qp + c);
        for (int j = 0; j < PF_K; j++) {
            int32_t pair;
            memcpy(&pair, krow[j] + 2 * c, 4);
            acc[j] = _mm512_dpbf16_ps(acc[j], qv, (__m512bh)_mm512_set1_epi32(pair));
        }
    }
}

/* o[d] (lanes = queries) += sum_j p[j] * vf[j][d], 16 dims at a time in registers */
static inline __attribute__((always_inline)) void pf_values(float *restrict o, const float *restrict p,
                                                           const float *restrict vf, const int D) {
    for (int d0 = 0; d0 < D; d0 += 16) {
        __m512 acc[16];
        for (int i = 0; i < 16; i++) acc[i] = _mm512_load_ps(o + (long)(d0 + i) * PF_Q);
        for (int j = 0; j < PF_K; j++) {
            const __m512 pj = _mm512_load_ps(p + j * PF_Q);
            for (int i = 0; i < 16; i++) acc[i] = _mm512_fmadd_ps(pj, _mm512_set1_ps(vf[j * D + d0 + i]), acc[i]);
        }
        for (int i = 0; i < 16; i++) _mm512_store_ps(o + (long)(d0 + i) * PF_Q, acc[i]);
    }
}

/* one work item; scratch: 64-byte aligned, G * D * 16 * 2 + 16 * D + 16 * 16 + 2 * G * 16 floats */
static void pf_item(const uint16_t *restrict q, const uint16_t *restrict K, const uint16_t *restrict V,
                    const int32_t *restrict table, uint16_t *restrict out, int start, int n, int L, int qb,
                    int h, int H, int G, int D, int block_size, float scale, int window, float softcap,
                    const float *restrict sinks, float *restrict scratch) {
    const int DP = D / 2, p0 = L - n + qb * PF_Q, nq = n - qb * PF_Q < PF_Q ? n - qb * PF_Q : PF_Q;
    const int plast = p0 + nq - 1;
    __m512i *qp = (__m512i *)scratch;                   /* [G][DP] 16 lanes of dim pairs */
    float *o = scratch + (long)G * DP * 16;             /* [G][D][16] */
    float *vf = o + (long)G * D * PF_Q;                 /* [16 keys][D] */
    float *s = vf + (long)PF_K * D;                     /* [16 keys][16 lanes] */
    float *m = s + PF_K * PF_Q; /* m, l: [G][16] */
    float *l = m + (long)G * PF_Q;
    int qpos[PF_Q];
    for (int r = 0; r < PF_Q; r++) qpos[r] = p0 + (r < nq ? r : nq - 1); /* padding lanes repeat the last */
    for (int g = 0; g < G; g++) {
        for (int r = 0; r < PF_Q; r++) {
            const uint32_t *row = (const uint32_t *)(q + ((long)(start + qpos[r] - (L - n)) * H + h * G + g) * D);
            uint32_t *dst = (uint32_t *)(qp + (long)g * DP);
            for (int c = 0; c < DP; c++) dst[c * 16 + r] = row[c];
        }
        for (int r = 0; r < PF_Q; r++) { m[g * PF_Q + r] = PF_NEG; l[g * PF_Q + r] = 0.f; }
    }
    memset(o, 0, sizeof(float) * (size_t)G * D * PF_Q);
    const __m512i qposv = _mm512_loadu_si512(qpos), vwindow = _mm512_set1_epi32(window);
    const __m512 vscale = _mm512_set1_ps(scale);
    const int k_begin = window > 0 && p0 - window + 1 > 0 ? p0 - window + 1 : 0, k_end = plast + 1;
    for (int k0 = k_begin; k0 < k_end; k0 += PF_K) {
        const int kn = k_end - k0 < PF_K ? k_end - k0 : PF_K;
        const uint16_t *krow[PF_K];
        for (int j = 0; j < PF_K; j++) {
            const long slot = slot_of(table, k0 + (j < kn ? j : kn - 1), block_size);
            krow[j] = K + slot * D;
            const uint16_t *v = V + slot * D;
            for (int d = 0; d < D; d += 16) _mm512_storeu_ps(vf + j * D + d, bf16x16_to_f32(v + d));
        }
        /* vis[j]: the lanes (query positions) that see key k0 + j; all of them off the diagonal and
         * the window's edge */
        const int full = kn == PF_K && k0 + PF_K - 1 <= p0 && (window <= 0 || k0 > plast - window);
        __mmask16 vis[PF_K];
        for (int j = 0; j < PF_K; j++) {
            const __m512i kp = _mm512_set1_epi32(k0 + j);
            vis[j] = full ? 0xFFFF : j < kn ? _mm512_cmple_epi32_mask(kp, qposv) : 0;
            if (!full && window > 0) vis[j] &= _mm512_cmpgt_epi32_mask(kp, _mm512_sub_epi32(qposv, vwindow));
        }
        for (int g = 0; g < G; g++) {
            __m512 acc[PF_K];
            if (D == 64) pf_scores(qp + (long)g * DP, krow, 32, acc);
            else pf_scores(qp + (long)g * DP, krow, DP, acc);
            for (int j = 0; j < PF_K; j++) acc[j] = _mm512_mul_ps(acc[j], vscale);
            if (softcap > 0.f) {
                for (int j = 0; j < PF_K; j++) _mm512_store_ps(s + j * PF_Q, acc[j]);
#pragma omp simd
                for (int i = 0; i < PF_K * PF_Q; i++) s[i] = softcap * tanhf(s[i] / softcap);
                for (int j = 0; j < PF_K; j++) acc[j] = _mm512_load_ps(s + j * PF_Q);
            }
            float *mg = m + g * PF_Q, *lg = l + g * PF_Q, *og = o + (long)g * D * PF_Q;
            const __m512 mold = _mm512_load_ps(mg);
            __m512 mx = mold;
            for (int j = 0; j < PF_K; j++) mx = _mm512_mask_max_ps(mx, vis[j], mx, acc[j]);
            const __m512 alpha = pf_exp(_mm512_sub_ps(mold, mx));
            __m512 sum = _mm512_mul_ps(_mm512_load_ps(lg), alpha);
            for (int j = 0; j < PF_K; j++) { /* probabilities, 0 where masked */
                const __m512 pj = _mm512_maskz_mov_ps(vis[j], pf_exp(_mm512_sub_ps(acc[j], mx)));
                sum = _mm512_add_ps(sum, pj);
                _mm512_store_ps(s + j * PF_Q, pj);
            }
            _mm512_store_ps(mg, mx);
            _mm512_store_ps(lg, sum);
            if (_mm512_cmp_ps_mask(mx, mold, _CMP_GT_OQ)) /* a lane's max rose: its sums so far scale down */
                for (int d = 0; d < D; d++) _mm512_store_ps(og + d * PF_Q, _mm512_mul_ps(alpha, _mm512_load_ps(og + d * PF_Q)));
            if (D == 64) pf_values(og, s, vf, 64);
            else pf_values(og, s, vf, D);
        }
    }
    for (int g = 0; g < G; g++) {
        float inv[PF_Q];
        for (int r = 0; r < PF_Q; r++) {
            float mx = m[g * PF_Q + r], sum = l[g * PF_Q + r], keep = 1.f;
            if (sinks) { /* one more logit in the denominator, with no value */
                const float sink = sinks[h * G + g], m2 = sink > mx ? sink : mx;
                keep = expf(mx - m2);
                sum = sum * keep + expf(sink - m2);
            }
            inv[r] = keep / sum;
        }
        for (int r = 0; r < nq; r++) {
            uint16_t *dst = out + ((long)(start + qb * PF_Q + r) * H + h * G + g) * D;
            const float *og = o + (long)g * D * PF_Q;
            for (int d = 0; d < D; d++) dst[d] = f32_to_bf16(og[d * PF_Q + r] * inv[r]);
        }
    }
}

void paged_prefill_bf16(const uint16_t *restrict q, const uint16_t *restrict kv, const int32_t *restrict chunks,
                        const int32_t *restrict tables, int C, uint16_t *restrict out, int H, int KVH, int D,
                        long S, int block_size, int max_blocks, float scale, int window, float softcap,
                        const float *restrict sinks, int num_threads) {
    const int G = H / KVH;
    long *first = malloc(sizeof(long) * (size_t)(C + 1)); /* first item of each chunk */
    first[0] = 0;
    for (int c = 0; c < C; c++) first[c + 1] = first[c] + (long)KVH * ((chunks[3 * c + 1] + PF_Q - 1) / PF_Q);
    const size_t scratch_floats = (size_t)G * D * PF_Q * 2 + (size_t)PF_K * D + PF_K * PF_Q + 2 * G * PF_Q;
    const uint16_t *K = kv, *V = kv + (long)KVH * S * D;
#pragma omp parallel num_threads(num_threads)
    {
        float *scratch = aligned_alloc(64, (scratch_floats * sizeof(float) + 63) / 64 * 64);
#pragma omp for schedule(dynamic, 1)
        for (long item = 0; item < first[C]; item++) {
            int c = 0;
            while (first[c + 1] <= item) c++;
            const long local = item - first[c];
            const int n = chunks[3 * c + 1], nb = (n + PF_Q - 1) / PF_Q, h = local % KVH;
            const int qb = nb - 1 - (int)(local / KVH); /* the last query blocks see the most keys: first */
            pf_item(q, K + (long)h * S * D, V + (long)h * S * D, tables + (long)c * max_blocks, out, chunks[3 * c], n,
                    chunks[3 * c + 2], qb, h, H, G, D, block_size, scale, window, softcap, sinks, scratch);
        }
        free(scratch);
    }
    free(first);
}
#else
int paged_prefill_bf16_supported(int D) {
    (void)D;
    return 0;
}

void paged_prefill_bf16(const uint16_t *restrict q, const uint16_t *restrict kv, const int32_t *restrict chunks,
                        const int32_t *restrict tables, int C, uint16_t *restrict out, int H, int KVH, int D,
                        long S, int block_size, int max_blocks, float scale, int window, float softcap,
                        const float *restrict sinks, int num_threads) {
    /* never called: paged_prefill_bf16_supported says no, and the backend takes its torch path */
    (void)q, (void)kv, (void)chunks, (void)tables, (void)C, (void)out, (void)H, (void)KVH, (void)D, (void)S;
    (void)block_size, (void)max_blocks, (void)scale, (void)window, (void)softcap, (void)sinks, (void)num_threads;
}
#endif
