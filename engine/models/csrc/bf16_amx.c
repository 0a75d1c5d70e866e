/* bf16 linear layer on AMX tiles (Intel Sapphire Rapids and later), over bf16_linear.c's panels:
 * y = x @ w^T + bias, x, w and y bf16, fp32 sums, each output rounded once to bf16 (nearest even).
 *
 * bf16_linear.c's panel of 32 channels, [K / 2][32][2], already is the layout of AMX's B operand:
 * 16 pairs of k (rows, 128 bytes apart) of 16 channels x 2 (64 bytes) is the B tile of one half of
 * the panel, so the panels serve both kernels. x's rows are A tiles in place (16 rows x 32 k, K
 * apart); a call of fewer than 16 rows goes through a zero-padded copy, and the last tile of a
 * call of 16 or more whose rows are not a multiple of 16 is the call's last 16 rows (it overlaps
 * the tile before it; only its new rows are written).
 *
 * Tiles: 0-3 the fp32 sums (16 x 16), 4-5 x, 6-7 weights. Up to 32 rows a panel takes one pass:
 * per 32 k both halves' weight tiles and each row tile's x tile, 2 x 2 products. From 33 to 64
 * rows each half of the panel takes a pass of up to 4 row tiles (the second half's weights are
 * L2's by then). More rows: blocks of 64 per panel, the panel in L2 after the first. Threads split
 * the panels: each weight byte comes from memory once per call. K must be a multiple of 32. */
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#define AMX_NR 32   /* channels a panel (bf16_linear.c's NR) */
#ifndef AMX_AHEAD
#define AMX_AHEAD 65536 /* bytes of weights prefetched ahead of the tile loads */
#endif
#define AMX_ROWS 32 /* rows of x a block: 2 row tiles */

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} AmxConfig;

/* Linux hands out AMX's tile state only on request, once per process (ARCH_REQ_XCOMP_PERM for
 * XFEATURE_XTILEDATA): 1 once granted (or granted before, e.g. by oneDNN), 0 where refused. */
int bf16_amx_available(void) {
    static int state = -1;
    if (state < 0) state = syscall(SYS_arch_prctl, 0x1023, 18) == 0;
    return state;
}

static void amx_configure(void) {
    AmxConfig c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int t = 0; t < 8; t++) c.rows[t] = 16, c.colsb[t] = 64;
    _tile_loadconfig(&c);
}

/* fp32 sums sums[r][32] (+ bias) -> bf16 y rows, nvalid channels of the panel */
static inline void amx_round(const float *sums, const float *bias, uint16_t *y, long ldy, int rows, int nvalid) {
    const __m512 b0 = _mm512_loadu_ps(bias), b1 = _mm512_loadu_ps(bias + 16);
    const __mmask32 keep = nvalid >= 32 ? 0xffffffffu : (1u << nvalid) - 1;
    for (int r = 0; r < rows; r++) {
        const __m256i lo = (__m256i)_mm512_cvtneps_pbh(_mm512_add_ps(_mm512_loadu_ps(sums + r * 32), b0));
        const __m256i hi = (__m256i)_mm512_cvtneps_pbh(_mm512_add_ps(_mm512_loadu_ps(sums + r * 32 + 16), b1));
        _mm512_mask_storeu_epi16(y + r * ldy, keep, _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1));
    }
}

/* One panel against the row tiles a0 (and a1 when two), each [K / 32][16][32]: sums [16 or 32][32].
 * Each tile is loaded again as soon as its last product of this k has been issued (tiles are not
 * renamed: a load waits for the products that read the tile before), so the loads of the next 32 k
 * overlap the products of this one. */
static void amx_panel(const uint16_t *a0, const uint16_t *a1, const uint16_t *panel, int K, float *sums) {
    const int kb = K / 32;
    _tile_zero(0);
    _tile_zero(1);
    _tile_loadd(6, panel, 128);
    _tile_loadd(7, panel + 32, 128);
    _tile_loadd(4, a0, 64);
    if (a1) {
        _tile_zero(2);
        _tile_zero(3);
        _tile_loadd(5, a1, 64);
    }
    for (int k = 0; k < kb; k++) {
        const uint16_t *w = panel + (long)(k + 1) * 1024; /* the next 32 k: 16 pairs x 32 channels x 2 */
        const int more = k + 1 < kb;
        for (int l = 0; l < 2048; l += 64) _mm_prefetch((const char *)w + AMX_AHEAD + l, _MM_HINT_T1);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        if (more) _tile_loadd(4, a0 + (k + 1) * 512, 64);
        if (a1) {
            _tile_dpbf16ps(2, 5, 6);
            if (more) _tile_loadd(6, w, 128);
            _tile_dpbf16ps(3, 5, 7);
            if (more) {
                _tile_loadd(7, w + 32, 128);
                _tile_loadd(5, a1 + (k + 1) * 512, 64);
            }
        } else if (more) {
            _tile_loadd(6, w, 128);
            _tile_loadd(7, w + 32, 128);
        }
    }
    _tile_stored(0, sums, 128);
    _tile_stored(1, sums + 16, 128);
    if (a1) {
        _tile_stored(2, sums + 16 * 32, 128);
        _tile_stored(3, sums + 16 * 32 + 16, 128);
    }
}

/* x [M, K] -> row tiles of 16 (zero rows past M), each [K / 32][16][32]: an A tile is 1 KiB in a row */
static uint16_t *amx_pack_x(const uint16_t *x, int M, int K) {
    static __thread uint16_t *buf = NULL;
    static __thread size_t size = 0;
    const int tiles = (M + 15) / 16;
    const size_t need = (size_t)tiles * 16 * K;
    if (need > size) {
        free(buf);
        buf = aligned_alloc(64, need * sizeof(uint16_t));
        size = buf ? need : 0;
        if (!buf) return NULL;
    }
    for (int t = 0; t < tiles; t++)
        for (int r = 0; r < 16; r++) {
            const int m = 16 * t + r;
            uint16_t *dst = buf + (size_t)t * 16 * K + r * 32;
            for (int k = 0; k < K; k += 32, dst += 16 * 32)
                if (m < M)
                    memcpy(dst, x + (size_t)m * K + k, 64);
                else
                    memset(dst, 0, 64);
        }
    return buf;
}

/* y [M, N] = x [M, K] @ w^T + bias on AMX; w in bf16_linear.c's panels, K a multiple of 32 */
void bf16_amx_linear(const uint16_t *restrict x, const uint16_t *restrict packed, const uint16_t *restrict bias,
                     uint16_t *restrict y, int M, int N, int K, int num_threads) {
    const int panels = (N + AMX_NR - 1) / AMX_NR;
    const uint16_t *xp = amx_pack_x(x, M, K);
    if (!xp) return;
    if (num_threads > panels) num_threads = panels;
#pragma omp parallel num_threads(num_threads)
    {
        int t = 0, nt = 1;
#ifdef _OPENMP
        t = omp_get_thread_num(), nt = omp_get_num_threads();
#endif
        const int p0 = (int)((long)panels * t / nt), p1 = (int)((long)panels * (t + 1) / nt);
        float sums[AMX_ROWS * AMX_NR] __attribute__((aligned(64)));
        float bf[AMX_NR] __attribute__((aligned(64)));
        if (p0 < p1) amx_configure();
        for (int p = p0; p < p1; p++) {
            const int n = p * AMX_NR, nvalid = N - n < AMX_NR ? N - n : AMX_NR;
            const uint16_t *panel = packed + (long)p * K * AMX_NR;
            for (int j = 0; j < AMX_NR; j++) {
                uint32_t u = bias && j < nvalid ? (uint32_t)bias[n + j] << 16 : 0;
                memcpy(bf + j, &u, 4);
            }
            for (int m0 = 0; m0 < M; m0 += AMX_ROWS) {
                const int rows = M - m0 < AMX_ROWS ? M - m0 : AMX_ROWS;
                const uint16_t *a0 = xp + (long)m0 * K;
                amx_panel(a0, rows > 16 ? a0 + 16L * K : NULL, panel, K, sums);
                amx_round(sums, bf, y + (long)m0 * N + n, N, rows, nvalid);
            }
        }
        if (p0 < p1) _tile_release();
    }
}
