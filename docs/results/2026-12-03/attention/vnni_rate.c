/* The rate of 512-bit vpdpbusd and vfmadd on one core, from registers (twelve independent chains): the ceiling
 * for qgemm_a8's tiles once several rows share the weights.  gcc -O2 -march=native vnni_rate.c && ./a.out */
#include <immintrin.h>
#include <stdio.h>
#include <time.h>
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + 1e-9 * t.tv_nsec; }
int main(void) {
    const long n = 200000000;
    __m512i a[12], u = _mm512_set1_epi8(3), x = _mm512_set1_epi8(5);
    for (int i = 0; i < 12; i++) a[i] = _mm512_set1_epi32(i);
    double t0 = now();
    for (long k = 0; k < n / 12; k++) {
        for (int i = 0; i < 12; i++) a[i] = _mm512_dpbusd_epi32(a[i], u, x);
        __asm__ volatile("" : "+v"(u), "+v"(x));
    }
    double dt = now() - t0;
    int s = 0;
    for (int i = 0; i < 12; i++) s += _mm512_reduce_add_epi32(a[i]);
    printf("vpdpbusd zmm: %.2f per ns, %.0f G int8 multiply-adds/s (checksum %d)\n", n / dt * 1e-9, 64 * n / dt * 1e-9, s);
    __m512 f[12], fa = _mm512_set1_ps(1.0001f), fb = _mm512_set1_ps(0.999f);
    for (int i = 0; i < 12; i++) f[i] = _mm512_set1_ps((float)i);
    t0 = now();
    for (long k = 0; k < n / 12; k++) {
        for (int i = 0; i < 12; i++) f[i] = _mm512_fmadd_ps(f[i], fa, fb);
        __asm__ volatile("" : "+v"(fa), "+v"(fb));
    }
    dt = now() - t0;
    float fs = 0;
    for (int i = 0; i < 12; i++) fs += _mm512_reduce_add_ps(f[i]);
    printf("vfmadd zmm:   %.2f per ns, %.0f G fp32 multiply-adds/s (checksum %g)\n", n / dt * 1e-9, 16 * n / dt * 1e-9, fs);
    return 0;
}
