/* INT8 linear on CPUs with AVX512-VNNI (every batch size): y = x @ (q * scale)^T + bias, the arithmetic of
 * engine/models/quant.py's `reference`: exact integer dot products per block of 32 along K, summed
 * in fp64 (each block's product with its activation scale is exact there), then rounded once to fp32.
 *
 * Layouts: x [M, K] fp32 (row-major, K % 32 == 0); the weight packed once (quant.py `pack_panels`)
 * into panels of NR = 32 output channels with k four at a time side by side, as unsigned bytes
 * w + 128: [ceil(N / NR)][K / 4][NR][4] (the last panel padded); scale [N] fp32, bias [N] fp32 or
 * NULL, y [M, N] fp32.
 *
 * The activations are quantized as int8_linear.c does (the same function: blocks of 32 along K,
 * d = max |x| / 127). The micro-kernel (its names prefixed: decode_forward.c includes this file beside
 * others) is bf16_linear.c's with `vpdpbusd`: it keeps an R x 32 tile
 * (R <= VMR = 4) and walks a block's eight groups of four k: per group it loads the panel's 32 x 4
 * weights (two vectors, one sequential stream per panel), broadcasts each row's four int8 values as
 * one 32-bit word and issues two `vpdpbusd` per row (each adds (w + 128) . x over four k into lane
 * n's int32). The int32 sums of a block start at -128 times the sum of the row's 32 values of x, so
 * after the eight groups each lane holds the block's exact w . x (|w . x| <= 32 * 127 * 127);
 * then per block and row two conversions to fp64 and two fma by the block's scale into fp64 sums
 * (4 fp64 vectors per row and panel). Per 32 products that is 0.5 `vpdpbusd` and about 0.3 extracts,
 * conversions and fma, where int8_linear.c's 256-bit tiles spend about 3-4 instructions.
 * Threads split the panels (and blocks of VMB rows). Without AVX512-VNNI the library only answers
 * `int8_vnni_available() == 0` and the caller runs int8_linear.c. */
#include "int8_linear.c"

int int8_vnni_panel_width(void) { return 32; }

#if defined(__AVX512VNNI__) && defined(__AVX512BW__) && defined(__AVX512F__)
#include <immintrin.h>
#include <string.h>

#define VNR 32
#define VMR 4
#define VMB 96 /* rows of x per block: kept in L2 across the panels of a work item */
#define VGROUPS (QK / 4) /* groups of four k per activation block */

int int8_vnni_available(void) { return 1; }

/* R rows of xq (K apart; block scales xd and corrections xc nb apart) against one panel:
 * y[i * ldy + j] = fp32(scale[j] * sum_b xd_ib * (xq_i,b . w_j,b) + bias[j]) */
static inline __attribute__((always_inline)) void vnni_ukernel(const int8_t *restrict xq, const float *restrict xd,
                                                          const int32_t *restrict xc,
                                                          const uint8_t *restrict panel,
                                                          const float *restrict scale, const float *restrict bias,
                                                          float *restrict y, long ldy, int K, int nvalid,
                                                          const int R) {
    const int nb = K / QK;
    __m512d acc[VMR][4];
    for (int i = 0; i < R; i++)
        for (int h = 0; h < 4; h++) acc[i][h] = _mm512_setzero_pd();
    for (int b = 0; b < nb; b++) {
        __m512i s[VMR][2];
        for (int i = 0; i < R; i++) s[i][0] = s[i][1] = _mm512_set1_epi32(xc[(long)i * nb + b]);
        const uint8_t *wb = panel + (long)b * VGROUPS * VNR * 4;
        for (int g = 0; g < VGROUPS; g++) {
            const __m512i w0 = _mm512_loadu_si512((const void *)(wb + g * VNR * 4));
            const __m512i w1 = _mm512_loadu_si512((const void *)(wb + g * VNR * 4 + 64));
            for (int i = 0; i < R; i++) {
                int32_t quad;
                memcpy(&quad, xq + (long)i * K + b * QK + g * 4, 4);
                const __m512i xb = _mm512_set1_epi32(quad);
                s[i][0] = _mm512_dpbusd_epi32(s[i][0], w0, xb); /* u8 (w + 128) x s8 x */
                s[i][1] = _mm512_dpbusd_epi32(s[i][1], w1, xb);
            }
        }
        for (int i = 0; i < R; i++) {
            const __m512d d = _mm512_set1_pd((double)xd[(long)i * nb + b]);
            for (int c = 0; c < 2; c++) { /* int32 -> fp64 exact; x d exact (20 + 24 bits) */
                acc[i][2 * c] = _mm512_fmadd_pd(_mm512_cvtepi32_pd(_mm512_castsi512_si256(s[i][c])), d, acc[i][2 * c]);
                acc[i][2 * c + 1] =
                    _mm512_fmadd_pd(_mm512_cvtepi32_pd(_mm512_extracti64x4_epi64(s[i][c], 1)), d, acc[i][2 * c + 1]);
            }
        }
    }
    double sc[VNR] = {0}, bs[VNR] = {0};
    for (int j = 0; j < nvalid; j++) sc[j] = scale[j], bs[j] = bias ? bias[j] : 0.;
    for (int i = 0; i < R; i++) {
        float out[VNR];
        for (int h = 0; h < 4; h++) {
            /* rounded as `reference`: the product, then the sum, then to fp32 */
            const __m512d p = _mm512_mul_round_pd(acc[i][h], _mm512_loadu_pd(sc + 8 * h),
                                                  _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            const __m512d v = _mm512_add_round_pd(p, _mm512_loadu_pd(bs + 8 * h),
                                                  _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            _mm256_storeu_ps(out + 8 * h, _mm512_cvtpd_ps(v));
        }
        memcpy(y + i * ldy, out, (size_t)nvalid * sizeof(float));
    }
}

#define VROWS(R)                                                                                          \
    vnni_ukernel(xq + (long)m * K, xd + (long)m * nb, xc + (long)m * nb, pn, scale + n, bn, y + (long)m * N + n, \
                 N, K, nvalid, R)

void int8_vnni_linear_f32(const float *restrict x, const uint8_t *restrict panels, const float *restrict scale,
                          const float *restrict bias, float *restrict y, int M, int N, int K, int num_threads) {
    const int nb = K / QK, npanels = (N + VNR - 1) / VNR, mblocks = (M + VMB - 1) / VMB;
    int8_t *xq = malloc((size_t)M * K);
    float *xd = malloc((size_t)M * nb * sizeof(float));
    int32_t *xc = malloc((size_t)M * nb * sizeof(int32_t));
#pragma omp parallel for schedule(static) num_threads(num_threads)
    for (int m = 0; m < M; m++) {
        quantize_rows(x + (long)m * K, xq + (long)m * K, xd + (long)m * nb, 1, K);
        for (int b = 0; b < nb; b++) { /* -128 * sum of the block's values: (w + 128) . x - that = w . x */
            int32_t s = 0;
            for (int t = 0; t < QK; t++) s += xq[(long)m * K + b * QK + t];
            xc[(long)m * nb + b] = -128 * s;
        }
    }
#pragma omp parallel for collapse(2) schedule(static) num_threads(num_threads)
    for (int mb = 0; mb < mblocks; mb++)
        for (int p = 0; p < npanels; p++) {
            const int n = p * VNR, nvalid = N - n < VNR ? N - n : VNR;
            const uint8_t *pn = panels + (long)p * K * VNR;
            const float *bn = bias ? bias + n : 0;
            const int m1 = (mb + 1) * VMB < M ? (mb + 1) * VMB : M;
            int m = mb * VMB;
            for (; m + VMR <= m1; m += VMR) VROWS(VMR);
            switch (m1 - m) {
            case 3: VROWS(3); break;
            case 2: VROWS(2); break;
            case 1: VROWS(1); break;
            default: break;
            }
        }
    free(xq);
    free(xd);
    free(xc);
}
#undef VNR
#undef VMR
#undef VMB
#undef VGROUPS
#undef VROWS
#else
int int8_vnni_available(void) { return 0; }

void int8_vnni_linear_f32(const float *x, const uint8_t *panels, const float *scale, const float *bias, float *y,
                          int M, int N, int K, int num_threads) {
    (void)x, (void)panels, (void)scale, (void)bias, (void)y, (void)M, (void)N, (void)K, (void)num_threads;
}
#endif
