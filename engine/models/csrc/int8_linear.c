/* INT8 linear layer for the CPU: y = x @ (q * scale)^T + bias, with integer dot products.
 *
 * Layouts: x [M, K] fp32 (row-major); q: the int8 weights [N, K] in [-127, 127], interleaved in
 * groups of four output channels: [N / 4][K / 32][4][32] (each group's rows block by block, so a
 * tile of four rows reads one sequential stream); scale [N] fp32 (per output channel), bias [N]
 * fp32 or NULL, y [M, N] fp32. N % 4 == 0, K % 32 == 0.
 *
 * Each call first quantizes the activations dynamically, in blocks of 32 along K (as llama.cpp's
 * Q8_0 does for its quantized dot products): d = max |x| / 127 over the block,
 * xq = round(x * (127 / max |x|)).
 * The products then run on 8-bit integers: per 32 weights, one unsigned x signed multiply-add into
 * 16 bits (|w| times x with w's sign, at most 2 * 127 * 127, no saturation), one into 32 bits,
 * then the block's int32 sums are converted and scaled by d into fp32 accumulators. On AVX2 that is
 * about 5 vector instructions per 32 weights where a conversion to fp32 took 4 per 8, so a decode
 * step stays bound by reading the int8 weights (a quarter of fp32's bytes). With AVX512-VNNI or
 * AVX-VNNI one `vpdpbusd` (unsigned x signed bytes, four products into each int32 lane) takes the
 * place of the two multiply-adds: the weights enter as w + 128 (unsigned) and the accumulator
 * starts at -128 times x's sums of four, so each lane holds the same exact integer as before and
 * the results are bit-identical; 3 instructions per 32 weights and row.
 *
 * Threads split the output channels in blocks of NB; inside a block, rows of x go four at a time
 * against pairs of weight rows, a remaining pair likewise, and a last row against four weight rows
 * (independent accumulators hide the latencies; each loaded vector serves several products).
 * Without AVX2 the same arithmetic runs in plain C. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#define NB 16  /* output channels per work item */
#define QK 32  /* activation quantization block */
#define GROUP 4 /* weight rows interleaved block by block */
#define PF_GROUPS 2 /* software prefetch distance, in groups */
/* row n's block b: groups of GROUP rows, each stored block-major ([N / 4][K / 32][4][32]) */
#define WROW(q, n, K) ((q) + (long)((n) / GROUP) * GROUP * (K) + ((n) % GROUP) * QK)

/* x [M, K] -> xq [M, K] int8, xd [M, K / QK] fp32 block scales */
static void quantize_rows(const float *restrict x, int8_t *restrict xq, float *restrict xd, long M, int K) {
    const int nb = K / QK;
    for (long r = 0; r < M * nb; r++) {
        const float *v = x + r * QK;
        float amax = 0.f;
        for (int i = 0; i < QK; i++) amax = fmaxf(amax, fabsf(v[i]));
        /* inv = 127 / amax, one true division as `reference` computes it: amax goes through a volatile
         * so that -ffast-math cannot rewrite it into 1 / d (one ulp away, and some x * inv near a tie
         * would round the other way) */
        volatile float av = amax;
        const float d = amax * (1.f / 127.f), inv = amax > 0.f ? 127.f / av : 0.f;
        xd[r] = d;
        for (int i = 0; i < QK; i++) xq[r * QK + i] = (int8_t)lrintf(v[i] * inv);
    }
}

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define DPBUSD _mm256_dpbusd_epi32 /* u8 x s8, four products summed into each int32 lane */
#elif defined(__AVXVNNI__)
#define DPBUSD _mm256_dpbusd_avx_epi32
#endif

static inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* R rows of xq (K apart, block scales nb apart) against C weight rows (K apart):
 * y[i * ldy + j] = (sum_b xd_ib * (xq_i,b . w_j,b)) * scale[j] + bias[j] */
static inline __attribute__((always_inline)) void i8_tile(const int8_t *restrict xq, const float *restrict xd,
                                                       const int8_t *restrict w, const float *restrict scale,
                                                       const float *restrict bias, float *restrict y, long ldy,
                                                       int K, const int R, const int C) {
    const int nb = K / QK;
#ifdef DPBUSD
    const __m256i u128 = _mm256_set1_epi8((char)0x80);
#else
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i wa[4];
#endif
    __m256 acc[4][4];
    for (int i = 0; i < R; i++)
        for (int j = 0; j < C; j++) acc[i][j] = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++) {
        __m256i wv[4];
        /* the same block PF_GROUPS groups ahead (the hardware prefetcher alone reached about 80%
         * of the read bandwidth) */
        _mm_prefetch((const char *)(w + (long)GROUP * K * PF_GROUPS + b * GROUP * QK), _MM_HINT_T0);
        _mm_prefetch((const char *)(w + (long)GROUP * K * PF_GROUPS + b * GROUP * QK + 64), _MM_HINT_T0);
#ifdef DPBUSD
        for (int j = 0; j < C; j++) /* w + 128 as unsigned bytes */
            wv[j] = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(w + j * QK + b * GROUP * QK)), u128);
        for (int i = 0; i < R; i++) {
            const __m256i xv = _mm256_loadu_si256((const __m256i *)(xq + (long)i * K + b * QK));
            const __m256 d = _mm256_broadcast_ss(xd + (long)i * nb + b);
            /* -128 * x's sums of four, lane by lane: from it dpbusd adds (w + 128) x to w x exactly */
            const __m256i corr = DPBUSD(_mm256_setzero_si256(), u128, _mm256_sub_epi8(_mm256_setzero_si256(), xv));
            for (int j = 0; j < C; j++)
                acc[i][j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(DPBUSD(corr, wv[j], xv)), d, acc[i][j]);
        }
#else
        for (int j = 0; j < C; j++) {
            wv[j] = _mm256_loadu_si256((const __m256i *)(w + j * QK + b * GROUP * QK));
            wa[j] = _mm256_sign_epi8(wv[j], wv[j]); /* |w| */
        }
        for (int i = 0; i < R; i++) {
            const __m256i xv = _mm256_loadu_si256((const __m256i *)(xq + (long)i * K + b * QK));
            const __m256 d = _mm256_broadcast_ss(xd + (long)i * nb + b);
            for (int j = 0; j < C; j++) {
                const __m256i p16 = _mm256_maddubs_epi16(wa[j], _mm256_sign_epi8(xv, wv[j]));
                const __m256 p = _mm256_cvtepi32_ps(_mm256_madd_epi16(p16, ones));
                acc[i][j] = _mm256_fmadd_ps(p, d, acc[i][j]);
            }
        }
#endif
    }
    for (int i = 0; i < R; i++)
        for (int j = 0; j < C; j++) y[i * ldy + j] = hsum(acc[i][j]) * scale[j] + (bias ? bias[j] : 0.f);
}
#else
static inline void i8_tile(const int8_t *restrict xq, const float *restrict xd, const int8_t *restrict w,
                        const float *restrict scale, const float *restrict bias, float *restrict y, long ldy,
                        int K, const int R, const int C) {
    const int nb = K / QK;
    for (int i = 0; i < R; i++)
        for (int j = 0; j < C; j++) {
            float s = 0.f;
            for (int b = 0; b < nb; b++) {
                int32_t d = 0;
                for (int t = 0; t < QK; t++) d += (int32_t)xq[(long)i * K + b * QK + t] * w[j * QK + b * GROUP * QK + t];
                s += (float)d * xd[(long)i * nb + b];
            }
            y[i * ldy + j] = s * scale[j] + (bias ? bias[j] : 0.f);
        }
}
#endif

void int8_linear_f32(const float *restrict x, const int8_t *restrict q, const float *restrict scale,
                     const float *restrict bias, float *restrict y, int M, int N, int K, int num_threads) {
    const int nb = K / QK;
    int8_t *xq = malloc((size_t)M * K);
    float *xd = malloc((size_t)M * nb * sizeof(float));
    if (M == 1) {
        quantize_rows(x, xq, xd, 1, K);
    } else {
#pragma omp parallel for schedule(static) num_threads(num_threads)
        for (int m = 0; m < M; m++) quantize_rows(x + (long)m * K, xq + (long)m * K, xd + (long)m * nb, 1, K);
    }
#pragma omp parallel for schedule(static) num_threads(num_threads)
    for (int n0 = 0; n0 < N; n0 += NB) {
        const int n1 = N - n0 < NB ? N : n0 + NB;
        int m = 0;
        for (; m + 2 <= M; m += 2) {
            const int r = M - m >= 4 ? 4 : 2;
            const int8_t *xm = xq + (long)m * K;
            const float *dm = xd + (long)m * nb;
            int n = n0;
            for (; n + 2 <= n1; n += 2) {
                const float *bn = bias ? bias + n : 0;
                if (r == 4) i8_tile(xm, dm, WROW(q, n, K), scale + n, bn, y + (long)m * N + n, N, K, 4, 2);
                else i8_tile(xm, dm, WROW(q, n, K), scale + n, bn, y + (long)m * N + n, N, K, 2, 2);
            }
            for (; n < n1; n++)
                i8_tile(xm, dm, WROW(q, n, K), scale + n, bias ? bias + n : 0, y + (long)m * N + n, N, K, r, 1);
            if (r == 4) m += 2;
        }
        for (; m < M; m++) {
            const int8_t *xm = xq + (long)m * K;
            const float *dm = xd + (long)m * nb;
            int n = n0;
            for (; n + 4 <= n1; n += 4)
                i8_tile(xm, dm, WROW(q, n, K), scale + n, bias ? bias + n : 0, y + (long)m * N + n, N, K, 1, 4);
            for (; n < n1; n++)
                i8_tile(xm, dm, WROW(q, n, K), scale + n, bias ? bias + n : 0, y + (long)m * N + n, N, K, 1, 1);
        }
    }
    free(xq);
    free(xd);
}
