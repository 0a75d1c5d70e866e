/* Memory read bandwidth: every thread streams its share of a buffer through vector loads, as a
 * batch-1 decode step streams the weights (OpenMP, work handed out in 256 KiB chunks, so that a
 * thread the OS pauses on a shared machine does not hold the others up). Four independent accumulators per thread keep several
 * loads in flight; the XOR costs less than the load, so the loop is bound by memory. The result is
 * returned so that the compiler keeps the loads. Buffer: n 64-byte lines (n * 64 bytes). */
#include <stdint.h>

#if defined(__AVX512F__)
#include <immintrin.h>
typedef __m512i vec;
#define vload(p) _mm512_load_si512((const void *)(p))
#define vxor _mm512_xor_si512
#define vzero _mm512_setzero_si512
#define PER_LINE 1
#elif defined(__AVX2__)
#include <immintrin.h>
typedef __m256i vec;
#define vload(p) _mm256_load_si256((const __m256i *)(p))
#define vxor _mm256_xor_si256
#define vzero _mm256_setzero_si256
#define PER_LINE 2
#else
typedef uint64_t vec;
#define vload(p) (*(const uint64_t *)(p))
#define vxor(a, b) ((a) ^ (b))
#define vzero() 0
#define PER_LINE 8
#endif
#define STEP (64 / PER_LINE) /* bytes per vector */

/* XOR of every 8-byte word of `buf` (64-byte aligned, lines * 64 bytes), read by num_threads threads */
uint64_t stream_read(const uint8_t *buf, long lines, int num_threads) {
    uint64_t total = 0;
#pragma omp parallel num_threads(num_threads) reduction(^ : total)
    {
        vec a0 = vzero(), a1 = vzero(), a2 = vzero(), a3 = vzero();
#pragma omp for schedule(dynamic, 4096) nowait
        for (long l = 0; l < lines; l += 4) {
            const uint8_t *p = buf + l * 64;
            for (int v = 0; v < PER_LINE; v++) {
                a0 = vxor(a0, vload(p + v * STEP));
                a1 = vxor(a1, vload(p + 64 + v * STEP));
                a2 = vxor(a2, vload(p + 128 + v * STEP));
                a3 = vxor(a3, vload(p + 192 + v * STEP));
            }
        }
        vec a = vxor(vxor(a0, a1), vxor(a2, a3));
        uint64_t words[sizeof(vec) / 8];
        __builtin_memcpy(words, &a, sizeof(vec));
        for (unsigned i = 0; i < sizeof(vec) / 8; i++) total ^= words[i];
    }
    return total;
}
