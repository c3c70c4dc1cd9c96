/* The sum of sixteen fp32 lanes in one fixed order (halves added down to one lane), shared by the AVX-512
 * kernels: qgemm.c, qgemm_a8.c and paged_attention.c (decoder_stack.c includes all three, hence the guard).
 * qgemm_a8.c's portable path reproduces this order lane by lane. */
#ifndef HYSPEC_HSUM16_H
#define HYSPEC_HSUM16_H
#if defined(__AVX512F__)
#include <immintrin.h>
static inline float hsum16(__m512 v) {
    const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
    const __m128 s = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(t, _mm_shuffle_ps(t, t, 1)));
}
#endif
#endif
