/* The core's fp32 multiply-add rate, the denominator of a compute floor: every thread runs CHAINS
 * independent FMA chains over the widest vectors the build has (AVX-512, AVX2 + FMA, else scalar),
 * more chains than an FMA's latency times its ports, so the loop is bound by the FMA units alone.
 * Returns the number of fp32 lanes a vector holds; the sums go to *sink so the compiler keeps the
 * work. FLOPs run: 2 * lanes * CHAINS * iters * num_threads. */
#if defined(__AVX512F__)
#include <immintrin.h>
typedef __m512 vec;
#define LANES 16
#define vfma _mm512_fmadd_ps
#define vset1 _mm512_set1_ps
#define vfirst _mm512_cvtss_f32
#elif defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
typedef __m256 vec;
#define LANES 8
#define vfma _mm256_fmadd_ps
#define vset1 _mm256_set1_ps
#define vfirst _mm256_cvtss_f32
#else
typedef float vec;
#define LANES 1
#define vfma(a, b, c) ((a) * (b) + (c))
#define vset1(v) (v)
#define vfirst(v) (v)
#endif
#define CHAINS 16

int fma_rate(long iters, int num_threads, float *sink) {
    float total = 0.f;
#pragma omp parallel num_threads(num_threads) reduction(+ : total)
    {
        vec acc[CHAINS];
        const vec w = vset1(0.999999f), x = vset1(1e-7f);
        for (int i = 0; i < CHAINS; i++) acc[i] = vset1((float)i);
        for (long n = 0; n < iters; n++) {
#pragma GCC unroll 16
            for (int i = 0; i < CHAINS; i++) acc[i] = vfma(acc[i], w, x);
        }
        for (int i = 0; i < CHAINS; i++) total += vfirst(acc[i]);
    }
    *sink = total;
    return LANES;
}
