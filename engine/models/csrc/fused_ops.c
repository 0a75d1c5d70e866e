/* The Llama forward's small fp32 operators, fused: one call each instead of four to six torch ops
 * (at batch 1 every torch op costs a few microseconds of dispatch for a few hundred floats).
 *
 *   add_rms_norm  x [T, C] += delta [T, C] (when delta is not NULL), then
 *                 out [T, C] = weight * (x * 1 / sqrt(mean(x^2) + eps))   (transformers' LlamaRMSNorm)
 *   rope          qk [T, heads, D] rotated in place at positions [T] (int64): with a = x[i],
 *                 b = x[i + D/2]: x[i] = a cos[i] + b sin[i], x[i + D/2] = b cos[i + D/2] + a sin[i + D/2],
 *                 where cos, sin [P, D] hold the model's tables (sin with its first half negated)
 *   silu_mul      gate_up [T, 2I] -> out [T, I] = silu(gate) * up
 *
 * add_rms_norm and rope have bf16 twins (`_bf16`, tensors as uint16 bit patterns) with torch's bf16
 * arithmetic step by step: every torch op computes in fp32 and rounds its result to bf16 (to nearest
 * even), so the twins round where torch's ops would (the residual add, the normed row before the
 * weight's product, each of rope's two products and their sum) and equal them bit for bit. SiLU·mul's
 * bf16 twin (AVX-512) calls torch's own expf (Sleef_expf16_u10, its address handed over from the
 * loaded libtorch): another expf (glibc's) moved 0.1% of its bf16 outputs by an ulp, enough to flip
 * near-tied greedy tokens against transformers.
 *
 * Rows are split over the threads only when a call has enough work (prefill); a decode row is a
 * few hundred floats, cheaper than waking a second thread. */
#include <math.h>
#include <stdint.h>
#include <string.h>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#define PARALLEL_MIN 65536 /* floats per call from which the threads share the rows */

void add_rms_norm(float *restrict x, const float *restrict delta, const float *restrict weight,
                  float *restrict out, int T, int C, float eps, int num_threads) {
#pragma omp parallel for schedule(static) num_threads(num_threads) if ((long)T * C >= PARALLEL_MIN)
    for (int t = 0; t < T; t++) {
        float *xr = x + (long)t * C;
        float *o = out + (long)t * C;
        if (delta) {
            const float *d = delta + (long)t * C;
            for (int c = 0; c < C; c++) xr[c] += d[c];
        }
        float ss = 0.f;
        for (int c = 0; c < C; c++) ss += xr[c] * xr[c];
        const float r = 1.f / sqrtf(ss / (float)C + eps);
        for (int c = 0; c < C; c++) o[c] = weight[c] * (xr[c] * r);
    }
}

void rope(float *restrict qk, const int64_t *restrict positions, const float *restrict cos_table,
          const float *restrict sin_table, int T, int heads, int D, long row_stride, int num_threads) {
    const int half = D / 2;
#pragma omp parallel for schedule(static) num_threads(num_threads) if ((long)T * heads * D >= PARALLEL_MIN)
    for (int t = 0; t < T; t++) {
        const float *c = cos_table + positions[t] * D, *s = sin_table + positions[t] * D;
        for (int h = 0; h < heads; h++) {
            float *v = qk + t * row_stride + (long)h * D;
            for (int i = 0; i < half; i++) {
                const float a = v[i], b = v[i + half];
                v[i] = a * c[i] + b * s[i];
                v[i + half] = b * c[i + half] + a * s[i + half];
            }
        }
    }
}

void silu_mul(const float *restrict gate_up, float *restrict out, int T, int I, int num_threads) {
#pragma omp parallel for schedule(static) num_threads(num_threads) if ((long)T * I >= PARALLEL_MIN)
    for (int t = 0; t < T; t++) {
        const float *g = gate_up + (long)t * 2 * I, *u = g + I;
        float *o = out + (long)t * I;
        for (int i = 0; i < I; i++) o[i] = g[i] / (1.f + expf(-g[i])) * u[i];
    }
}

static inline float bf(uint16_t v) {
    uint32_t u = (uint32_t)v << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t to_bf(float f) { /* round to nearest even, as torch's .to(torch.bfloat16) */
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)((u + 0x7FFF + ((u >> 16) & 1)) >> 16);
}

void add_rms_norm_bf16(uint16_t *restrict x, const uint16_t *restrict delta, const uint16_t *restrict weight,
                       uint16_t *restrict out, int T, int C, float eps, int num_threads) {
#pragma omp parallel for schedule(static) num_threads(num_threads) if ((long)T * C >= PARALLEL_MIN)
    for (int t = 0; t < T; t++) {
        uint16_t *xr = x + (long)t * C, *o = out + (long)t * C;
        if (delta) {
            const uint16_t *d = delta + (long)t * C;
            for (int c = 0; c < C; c++) xr[c] = to_bf(bf(xr[c]) + bf(d[c]));
        }
        float ss = 0.f;
        for (int c = 0; c < C; c++) ss += bf(xr[c]) * bf(xr[c]);
        const float r = 1.f / sqrtf(ss / (float)C + eps);
        for (int c = 0; c < C; c++) o[c] = to_bf(bf(weight[c]) * bf(to_bf(bf(xr[c]) * r)));
    }
}

void rope_bf16(uint16_t *restrict qk, const int64_t *restrict positions, const uint16_t *restrict cos_table,
               const uint16_t *restrict sin_table, int T, int heads, int D, long row_stride, int num_threads) {
    const int half = D / 2;
#pragma omp parallel for schedule(static) num_threads(num_threads) if ((long)T * heads * D >= PARALLEL_MIN)
    for (int t = 0; t < T; t++) {
        const uint16_t *c = cos_table + positions[t] * D, *s = sin_table + positions[t] * D;
        for (int h = 0; h < heads; h++) {
            uint16_t *v = qk + t * row_stride + (long)h * D;
            for (int i = 0; i < half; i++) {
                const float a = bf(v[i]), b = bf(v[i + half]);
                v[i] = to_bf(bf(to_bf(a * bf(c[i]))) + bf(to_bf(b * bf(s[i]))));
                v[i + half] = to_bf(bf(to_bf(b * bf(c[i + half]))) + bf(to_bf(a * bf(s[i + half]))));
            }
        }
    }
}

/* out[r] = the index of row r's largest value in x [R, V] (fp32), as torch's argmax picks it: the
 * first of equal maxima, and the first NaN where a row has one (torch orders NaN above every
 * number). NaN is told from its bits (this file is built with -ffast-math). Two passes a row: the
 * maximum (and whether a NaN is there), then its first index (the row stays in L2); AVX-512 where
 * the CPU has it, 64 values an iteration. */
static long argmax_row(const float *restrict x, long V) {
    const uint32_t *bits = (const uint32_t *)x;
    float m = x[0];
    int nan = 0;
    long i = 0;
#if defined(__AVX512F__)
    if (V >= 64) {
        const __m512i abs = _mm512_set1_epi32(0x7FFFFFFF), inf = _mm512_set1_epi32(0x7F800000);
        __m512 mv[4];
        __mmask16 nm = 0;
        for (int a = 0; a < 4; a++) mv[a] = _mm512_set1_ps(m);
        for (; i + 64 <= V; i += 64)
            for (int a = 0; a < 4; a++) {
                const __m512i u = _mm512_loadu_si512(x + i + 16 * a);
                nm |= _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, abs), inf);
                mv[a] = _mm512_max_ps(mv[a], _mm512_castsi512_ps(u));
            }
        m = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_max_ps(mv[0], mv[1]), _mm512_max_ps(mv[2], mv[3])));
        nan = nm != 0;
    }
#endif
    for (; i < V; i++) {
        nan |= (bits[i] & 0x7FFFFFFFu) > 0x7F800000u;
        m = x[i] > m ? x[i] : m;
    }
    if (nan) {
        for (i = 0; i < V; i++)
            if ((bits[i] & 0x7FFFFFFFu) > 0x7F800000u) return i;
    }
    i = 0;
#if defined(__AVX512F__)
    const __m512 mv = _mm512_set1_ps(m);
    for (; i + 16 <= V; i += 16) {
        const __mmask16 eq = _mm512_cmpeq_ps_mask(_mm512_loadu_ps(x + i), mv);
        if (eq) return i + __builtin_ctz(eq);
    }
#endif
    for (; i < V; i++)
        if (x[i] == m) return i;
    return 0;
}

void argmax_f32(const float *restrict x, int64_t *restrict out, int R, long V, int num_threads) {
#pragma omp parallel for schedule(static) num_threads(num_threads) if ((long)R * V >= PARALLEL_MIN)
    for (int r = 0; r < R; r++) out[r] = argmax_row(x + (long)r * V, V);
}

#if defined(__AVX512F__)
typedef __m512 (*expf16_fn)(__m512);

static inline __m512 bf16x16(const uint16_t *p) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
}

static inline __m256i to_bf16x16(__m512 x) { /* round to nearest even; NaN -> 0xFFFF, as torch's AVX-512 path */
    const __m512i u = _mm512_castps_si512(x);
    const __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7FFF),
                                                           _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1))));
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7FFFFFFF)),
                                                  _mm512_set1_epi32(0x7F800000));
    return _mm512_cvtepi32_epi16(_mm512_mask_mov_epi32(_mm512_srli_epi32(r, 16), nan, _mm512_set1_epi32(0xFFFF)));
}

/* silu_mul in bf16 as torch computes F.silu(gate) * up on an AVX-512 CPU, 16 values at a time:
 * silu in fp32 as x / (1 + exp(-x)) with torch's own exp (Sleef_expf16_u10, handed over from the
 * loaded libtorch), rounded to bf16, times up in fp32, rounded again. I a multiple of 16. Built
 * without -ffast-math's licence to reassociate or use reciprocals: the division is IEEE's. */
__attribute__((optimize("no-fast-math"))) void silu_mul_bf16(const uint16_t *restrict gate_up, uint16_t *restrict out,
                                                             int T, int I, void *expf16, int num_threads) {
    const expf16_fn exp16 = (expf16_fn)expf16;
#pragma omp parallel for schedule(static) num_threads(num_threads) if ((long)T * I >= PARALLEL_MIN / 4)
    for (int t = 0; t < T; t++) {
        const uint16_t *g = gate_up + (long)t * 2 * I, *u = g + I;
        uint16_t *o = out + (long)t * I;
        for (int i = 0; i < I; i += 16) {
            const __m512 x = bf16x16(g + i);
            const __m512 e = exp16(_mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(x), _mm512_set1_epi32((int)0x80000000u))));
            const __m512 s = _mm512_div_ps(x, _mm512_add_ps(_mm512_set1_ps(1.f), e));
            const __m512 silu = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(to_bf16x16(s)), 16));
            _mm256_storeu_si256((__m256i *)(o + i), to_bf16x16(_mm512_mul_ps(silu, bf16x16(u + i))));
        }
    }
}
#endif
