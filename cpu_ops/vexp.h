/* exp over many fp32 values at once, for the softmax of paged_attention.c and the SiLU of decoder_stack.c.
 *
 * With AVX-512, sixteen lanes: n = round(x log2 e), r = x - n ln 2 in two parts (Cody-Waite), a degree-7
 * polynomial for e^r (Cephes' expf coefficients, within 2 ulp of the true value), then scaled by 2^n with
 * vscalefps (overflow gives inf, underflow 0, as expf does; NaN stays NaN).  libm's expf is scalar: it
 * was 3.5 % of a verification of 8 rows (368,640 calls a forward of 30 layers).  Without AVX-512, libm's
 * expf one value at a time.  Either way every value goes through the same operations wherever it sits in
 * a batch, so the kernels stay batch-invariant.
 */
#ifndef HYSPEC_VEXP_H
#define HYSPEC_VEXP_H
#include <math.h>
#include <stdint.h>

#if defined(__AVX512F__)
#include <immintrin.h>
static inline __m512 vexp16(__m512 x) {
    /* clamped where exp is 0 or inf anyway, so that r stays finite (max / min keep a NaN x) */
    x = _mm512_min_ps(_mm512_set1_ps(89.0f), _mm512_max_ps(_mm512_set1_ps(-104.0f), x));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_scalef_ps(p, n);
}
#endif

/* y[i] = exp(x[i]) for i < n (y may be x) */
static inline void vexp_array(const float *x, float *y, int64_t n) {
#if defined(__AVX512F__)
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, vexp16(_mm512_loadu_ps(x + i)));
    if (i < n) {
        const __mmask16 k = (__mmask16)((1u << (n - i)) - 1u);
        _mm512_mask_storeu_ps(y + i, k, vexp16(_mm512_maskz_loadu_ps(k, x + i)));
    }
#else
    for (int64_t i = 0; i < n; i++) y[i] = expf(x[i]);
#endif
}
#endif
