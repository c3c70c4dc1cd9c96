/* How fast this machine streams memory: a 512-bit read-and-add over `bytes` bytes (argv[1]), OMP_NUM_THREADS
 * threads, five passes (a buffer far past L3 gives the DRAM rate).  gcc -O3 -march=native -fopenmp */
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}
int main(int argc, char **argv) {
    const size_t n = (size_t)atol(argc > 1 ? argv[1] : "400000000") / 4 / 64 * 64;
    float *a = aligned_alloc(64, n * 4);
    for (size_t i = 0; i < n; i++) a[i] = 1.0f;
    for (int rep = 0; rep < 5; rep++) {
        const double t = now();
        float total = 0;
#pragma omp parallel reduction(+ : total)
        {
            __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
#pragma omp for
            for (size_t i = 0; i < n; i += 64) {
                s0 = _mm512_add_ps(s0, _mm512_load_ps(a + i));
                s1 = _mm512_add_ps(s1, _mm512_load_ps(a + i + 16));
                s2 = _mm512_add_ps(s2, _mm512_load_ps(a + i + 32));
                s3 = _mm512_add_ps(s3, _mm512_load_ps(a + i + 48));
            }
            total += _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3)));
        }
        printf("%zu MB: %.1f GB/s (sum %g)\n", n * 4 >> 20, n * 4 / (now() - t) / 1e9, total);
    }
    return 0;
}
