/*
 * y[m, n] = sum_k x[m, k] * w[n, k] (+ bias[n]) for dense fp32 or bf16 weights, with every output
 * computed the same way whatever the number of rows M: the batch-invariant linear layer.
 *
 * Why not MKL / oneDNN: their GEMMs pick blockings (and so summation orders) from the shape, so a
 * row's bits change with how many rows share the call -- measured on AMD Zen 5 (fp32 from 5 rows
 * up), Zen 3 (fp32, bf16) and Ice Lake (bf16).  Then verifying n drafted tokens in one forward
 * rounds differently from n one-token steps and near-ties flip.  Here each (row, output) pair has
 * one accumulator vector that takes x[m, k] * w[n, k] for k = lane, lane + VL, ... in increasing k,
 * then one fixed horizontal sum, then the bias: the same operations in the same order for every
 * row, row tile, thread count and call.  The order depends on the ISA the library was built for
 * (VL = 16 with AVX-512, 8 with AVX2, 8 scalar lanes otherwise), i.e. on the machine, never on
 * the batch.
 *
 * bf16: inputs and weights are widened to fp32 exactly (a bf16 is the top half of an fp32), the
 * sums are fp32 as above, and the result (bias added in fp32) is rounded once to bf16, nearest-even:
 * what oneDNN's bf16 linear computes up to summation order.
 *
 * Blocking: OpenMP over blocks of four outputs; in a block, row tiles of R rows keep R x 4
 * accumulators in registers while the block's four weight rows stay in L1.  Rows are taken in
 * chunks of ROW_CHUNK so that the chunk of x stays in L2 while every block passes over it.
 *
 * Built at first use by hyspec.cpu_ops.dense_gemm (cc -O3 -march=native -fopenmp) and called
 * through ctypes; loaded after torch, it shares torch's OpenMP pool.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"

#if defined(__AVX512F__)
#include <immintrin.h>
#define HYSPEC_AVX512 1
#if defined(__AVX512BF16__)
#define HYSPEC_DPBF16 1 /* bf16 pairs multiplied and summed into fp32 lanes in one instruction */
#endif
#elif defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define HYSPEC_AVX2 1
#endif

enum { F32 = 0, BF16 = 1 };
enum { ROW_CHUNK = 64 }; /* rows of x kept hot in L2 while every output block passes over them */

int hyspec_dense_gemm_version(void) { return 1; }

#if defined(HYSPEC_AVX512)
#ifdef HYSPEC_DPBF16
const char *hyspec_dense_gemm_isa(void) { return "avx512f+avx512_bf16"; }
#else
const char *hyspec_dense_gemm_isa(void) { return "avx512f"; }
#endif
#define VL 16
#define R_MAX 4
typedef __m512 vec;
static inline vec vzero(void) { return _mm512_setzero_ps(); }
static inline vec vfma(vec a, vec b, vec c) { return _mm512_fmadd_ps(a, b, c); }
static inline float vsum(vec v) { /* a fixed tree: halves added down to one lane */
    const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
    const __m128 s = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(t, _mm_shuffle_ps(t, t, 1)));
}
/* VL elements from k (count < VL: the rest read as 0, which adds +0 to a lane: no change) */
static inline vec load_f32(const float *p, int count) {
    if (count == VL) return _mm512_loadu_ps(p);
    return _mm512_maskz_loadu_ps((__mmask16)((1u << count) - 1u), p);
}
static inline vec load_bf16(const uint16_t *p, int count) {
    const __m256i h = count == VL ? _mm256_loadu_si256((const __m256i *)p)
                                  : _mm256_maskz_loadu_epi16((__mmask16)((1u << count) - 1u), p);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
#elif defined(HYSPEC_AVX2)
const char *hyspec_dense_gemm_isa(void) { return "avx2+fma"; }
#define VL 8
#define R_MAX 2
typedef __m256 vec;
static inline vec vzero(void) { return _mm256_setzero_ps(); }
static inline vec vfma(vec a, vec b, vec c) { return _mm256_fmadd_ps(a, b, c); }
static inline float vsum(vec v) {
    const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(t, _mm_shuffle_ps(t, t, 1)));
}
static inline vec load_f32(const float *p, int count) {
    if (count == VL) return _mm256_loadu_ps(p);
    float tmp[VL] = {0};
    memcpy(tmp, p, sizeof(float) * (size_t)count);
    return _mm256_loadu_ps(tmp);
}
static inline vec load_bf16(const uint16_t *p, int count) {
    if (count == VL) {
        const __m128i h = _mm_loadu_si128((const __m128i *)p);
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
    uint16_t tmp[VL] = {0};
    memcpy(tmp, p, sizeof(uint16_t) * (size_t)count);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)tmp)), 16));
}
#else
const char *hyspec_dense_gemm_isa(void) { return "portable"; }
#define VL 8
#define R_MAX 1
typedef struct { float l[VL]; } vec;
static inline vec vzero(void) { vec v = {{0}}; return v; }
static inline vec vfma(vec a, vec b, vec c) {
    for (int j = 0; j < VL; j++) c.l[j] = __builtin_fmaf(a.l[j], b.l[j], c.l[j]);
    return c;
}
static inline float vsum(vec v) {
    const float s0 = v.l[0] + v.l[4], s1 = v.l[1] + v.l[5], s2 = v.l[2] + v.l[6], s3 = v.l[3] + v.l[7];
    return (s0 + s2) + (s1 + s3);
}
static inline vec load_f32(const float *p, int count) {
    vec v = {{0}};
    for (int j = 0; j < count; j++) v.l[j] = p[j];
    return v;
}
static inline vec load_bf16(const uint16_t *p, int count) {
    vec v = {{0}};
    for (int j = 0; j < count; j++) v.l[j] = bf16_to_f32(p[j]);
    return v;
}
#endif

/* Software prefetch, one row of x: a tile reads its block's NB weight rows (one contiguous region) as NB
 * interleaved streams, and on a Zen 4 VM the hardware prefetchers left lines out -- bf16 weights were read at
 * 14-15 GB/s of a 37 GB/s copy bandwidth (docs/results/2026-12-03/attention/dense_rows.sh).  So one sweep runs
 * DENSE_PREFETCH_BYTES ahead of the tile's progress through the region (the next block's rows included). */
#ifndef DENSE_PREFETCH_BYTES
#define DENSE_PREFETCH_BYTES 8192
#endif
#if defined(HYSPEC_AVX512) || defined(HYSPEC_AVX2)
#define PREFETCH(p) _mm_prefetch((const char *)(p), _MM_HINT_T0)
#else
#define PREFETCH(p) ((void)(p))
#endif

/* one weight row's VL elements at k, widened to fp32 */
static inline __attribute__((always_inline)) vec load_w(const int wtype, const void *w, int64_t index, int count) {
    return wtype == BF16 ? load_bf16((const uint16_t *)w + index, count) : load_f32((const float *)w + index, count);
}

/* R rows of x (fp32, row stride K) against NB <= 4 weight rows n0.. : sums[r * 4 + i] */
static inline __attribute__((always_inline)) void tile(const int wtype, const int R, const float *x, int64_t K,
                                                       const void *w, int64_t n0, int NB, float *sums) {
    vec acc[R_MAX][4];
    for (int r = 0; r < R; r++)
        for (int i = 0; i < 4; i++) acc[r][i] = vzero();
    const int es = wtype == BF16 ? 2 : 4;
    const char *region = (const char *)w + n0 * K * es; /* the block's NB rows */
    for (int64_t k = 0; k < K; k += VL) {
        const int count = K - k >= VL ? VL : (int)(K - k);
        vec wv[4];
        if (R == 1 && k * es % 64 == 0) /* a line per row per 64 bytes of progress */
            for (int i = 0; i < NB; i++) PREFETCH(region + (k * es / 64 * NB + i) * 64 + DENSE_PREFETCH_BYTES);
        for (int i = 0; i < 4; i++) wv[i] = i < NB ? load_w(wtype, w, (n0 + i) * K + k, count) : vzero();
        for (int r = 0; r < R; r++) {
            const vec xv = load_f32(x + r * K + k, count);
            for (int i = 0; i < 4; i++)
                if (i < NB) acc[r][i] = vfma(xv, wv[i], acc[r][i]);
        }
    }
    for (int r = 0; r < R; r++)
        for (int i = 0; i < NB; i++) sums[r * 4 + i] = vsum(acc[r][i]);
}

#ifdef HYSPEC_DPBF16
/* bf16 with AVX512_BF16: x stays bf16 and vdpbf16ps adds x[k] w[k] + x[k+1] w[k+1] into lane k / 2 for
 * 32 elements per step, k increasing; the same instructions in the same order for every row. */
static inline __m512 load_pairs(const uint16_t *p, int64_t count) {
    if (count >= 32) return _mm512_castsi512_ps(_mm512_loadu_si512(p));
    return _mm512_castsi512_ps(_mm512_maskz_loadu_epi16((__mmask32)((1ull << count) - 1ull), p));
}
static inline __attribute__((always_inline)) void tile_dpbf16(const int R, const uint16_t *x, int64_t K,
                                                              const uint16_t *w, int64_t n0, int NB, float *sums) {
    __m512 acc[R_MAX][4];
    for (int r = 0; r < R; r++)
        for (int i = 0; i < 4; i++) acc[r][i] = _mm512_setzero_ps();
    const char *region = (const char *)(w + n0 * K); /* the block's NB rows: one contiguous region */
    for (int64_t k = 0; k < K; k += 32) {
        __m512 wv[4];
        if (R == 1)
            for (int i = 0; i < NB; i++) PREFETCH(region + (k / 32 * NB + i) * 64 + DENSE_PREFETCH_BYTES);
        for (int i = 0; i < 4; i++) wv[i] = i < NB ? load_pairs(w + (n0 + i) * K + k, K - k) : _mm512_setzero_ps();
        for (int r = 0; r < R; r++) {
            const __m512 xv = load_pairs(x + r * K + k, K - k);
            for (int i = 0; i < 4; i++)
                if (i < NB) acc[r][i] = _mm512_dpbf16_ps(acc[r][i], (__m512bh)xv, (__m512bh)wv[i]);
        }
    }
    for (int r = 0; r < R; r++)
        for (int i = 0; i < NB; i++) sums[r * 4 + i] = vsum(acc[r][i]);
}
#endif

static inline __attribute__((always_inline)) void store(const int ytype, void *y, int64_t index, float v) {
    if (ytype == BF16) ((uint16_t *)y)[index] = f32_to_bf16(v);
    else ((float *)y)[index] = v;
}

#ifdef HYSPEC_DPBF16 /* x is bf16 (not widened) on this path */
#define TILE(r, nb) (wtype == BF16 ? tile_dpbf16(r, (const uint16_t *)x + m * K, K, (const uint16_t *)w, n0, nb, sums) \
                               : tile(wtype, r, (const float *)x + m * K, K, w, n0, nb, sums))
#else
#define TILE(r, nb) tile(wtype, r, (const float *)x + m * K, K, w, n0, nb, sums)
#endif
#if R_MAX >= 4
#define TILE_CASES_4(nb) case 4: TILE(4, nb); break; \
                         case 3: TILE(3, nb); break;
#else
#define TILE_CASES_4(nb)
#endif
#if R_MAX >= 2
#define TILE_CASES_2(nb) case 2: TILE(2, nb); break;
#else
#define TILE_CASES_2(nb)
#endif
#define TILES(nb) { switch (R) { TILE_CASES_4(nb) TILE_CASES_2(nb) \
                                 default: TILE(1, nb); break; } }

/* rows m0 .. m0 + M - 1 of x against output block n0 (NB outputs) */
static inline __attribute__((always_inline)) void block(const int wtype, const void *x, int64_t M, int64_t K,
                                                        const void *w, const float *bias, int64_t n0, int NB,
                                                        void *y, int64_t m0, int64_t N) {
    float sums[R_MAX * 4];
    for (int64_t m = 0; m < M; m += R_MAX) {
        const int R = M - m >= R_MAX ? R_MAX : (int)(M - m);
        /* compile-time row and output counts keep the accumulators in registers */
        if (NB == 4) TILES(4)
        else TILES(NB)
        for (int r = 0; r < R; r++)
            for (int i = 0; i < NB; i++) {
                const float v = bias ? sums[r * 4 + i] + bias[n0 + i] : sums[r * 4 + i];
                store(wtype, y, (m0 + m + r) * N + n0 + i, v);
            }
    }
}

/* x [M, K], w [N, K], bias [N] or NULL, y [M, N]; all of dtype F32 or all BF16, contiguous.
 * Returns 0, -1 on bad arguments, -2 when out of memory. */
int hyspec_dense_gemm(int dtype, const void *x, int64_t M, int64_t K, const void *w, int64_t N, const void *bias,
                      void *y) {
    if ((dtype != F32 && dtype != BF16) || M < 0 || K < 1 || N < 0) return -1;
    if (M == 0 || N == 0) return 0;
    const void *xf = x;
    const float *bf = (const float *)bias;
    float *xbuf = NULL, *bbuf = NULL;
#ifdef HYSPEC_DPBF16
    const int widen_x = 0; /* vdpbf16ps takes bf16 x as it is */
#else
    const int widen_x = 1;
#endif
    if (dtype == BF16) { /* widen x (unless vdpbf16ps takes it) and the bias once (exact) */
        xbuf = widen_x ? malloc(sizeof(float) * (size_t)(M * K)) : NULL;
        bbuf = bias ? malloc(sizeof(float) * (size_t)N) : NULL;
        if ((widen_x && !xbuf) || (bias && !bbuf)) {
            free(xbuf);
            free(bbuf);
            return -2;
        }
        for (int64_t i = 0; widen_x && i < M * K; i++) xbuf[i] = bf16_to_f32(((const uint16_t *)x)[i]);
        for (int64_t i = 0; bias && i < N; i++) bbuf[i] = bf16_to_f32(((const uint16_t *)bias)[i]);
        if (widen_x) xf = xbuf;
        bf = bbuf;
    }
    const int64_t nblocks = (N + 3) / 4;
    for (int64_t m0 = 0; m0 < M; m0 += ROW_CHUNK) {
        const int64_t rows = M - m0 >= ROW_CHUNK ? ROW_CHUNK : M - m0;
        const size_t xsize = dtype == BF16 && !widen_x ? sizeof(uint16_t) : sizeof(float);
        const void *xc = (const char *)xf + (size_t)(m0 * K) * xsize;
#pragma omp parallel for schedule(static)
        for (int64_t b = 0; b < nblocks; b++) {
            const int64_t n0 = b * 4;
            const int NB = N - n0 >= 4 ? 4 : (int)(N - n0);
            if (dtype == BF16) block(BF16, xc, rows, K, w, bf, n0, NB, y, m0, N);
            else block(F32, xc, rows, K, w, bf, n0, NB, y, m0, N);
        }
    }
    free(xbuf);
    free(bbuf);
    return 0;
}
