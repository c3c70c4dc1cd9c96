/* One core's fp32 fma peak: twelve independent chains of 512-bit fmas.
 *     cc -O3 -funroll-loops -march=native -o /tmp/fma_peak fma_peak.c && /tmp/fma_peak
 * On the Zen 4 VM of this folder: 58.7 G multiply-adds a second (run 2026-12-07, machine otherwise idle). */
#include <immintrin.h>
#include <stdio.h>
#include <time.h>

int main(void) {
    __m512 a[12];
    for (int i = 0; i < 12; i++) a[i] = _mm512_set1_ps(i * 0.001f);
    const __m512 b = _mm512_set1_ps(0.9999f), c = _mm512_set1_ps(1e-6f);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    const long n = 400000000;
    for (long k = 0; k < n; k++)
        for (int i = 0; i < 12; i++) a[i] = _mm512_fmadd_ps(a[i], b, c);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    const double s = (t1.tv_sec - t0.tv_sec) + 1e-9 * (t1.tv_nsec - t0.tv_nsec);
    float r = 0;
    for (int i = 0; i < 12; i++) r += _mm512_reduce_add_ps(a[i]);
    printf("%.1f G fp32 multiply-adds a second (checksum %f)\n", n * 12.0 * 16 / s / 1e9, r);
    return 0;
}
