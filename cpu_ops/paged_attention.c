/*
 * Paged attention on the CPU for fp32 or bf16 caches, straight from the pages (no gathered copy of the cache).
 *
 * Semantics are the reference op's (core/ops/attention.py): packed query rows, row t belongs to
 * sequence row_seq[t] as its query row_i[t]; the sequence's committed context is c = seq_len - n and
 * query i sees every context entry j < c and new entry c + k iff k <= i (causal) or, with a tree,
 * iff tree_mask[t, k].  With a sliding window w > 0 (hyspec_paged_attention_windowed) it sees, of
 * those, only the entries at positions > positions[t] - w: context entry j sits at position j, new
 * entry c + k at the position of its sequence's query row k.
 *
 * Each (row, head) is computed alone: scores over the visible entries in position order, their
 * maximum, exp and sum in that order, then the value rows weighted in the same order and divided
 * by the sum once.  A row's result depends on its query and the entries it sees, nothing else: a
 * decode step and the verification of the same position give the same output bit for bit.
 *
 * bf16 (q, caches and output): every element is widened to fp32 exactly, the computation above runs
 * in fp32, and the output is rounded once to bf16 (nearest even).  torch's SDPA on bf16 picks its
 * kernel and blocking from the query count, so a verified token's attention rounded differently
 * from its decode step (measured on AMD Zen 5); here it cannot.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"
#include "vexp.h"

#if defined(__AVX512F__)
#include <immintrin.h>
/* sixteen lanes where the head size allows (SmolLM2: 64), half the instructions of eight */
#include "hsum16.h"
static inline __m512 widen16(const uint16_t *p) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
}
#define HYSPEC_WIDE(D) ((D) % 16 == 0)
#else
#define HYSPEC_WIDE(D) 0
#endif

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
static inline float dot(const float *a, const float *b, int64_t D) { /* D % 8 == 0 */
#if defined(__AVX512F__)
    if (HYSPEC_WIDE(D)) {
        __m512 acc = _mm512_setzero_ps();
        for (int64_t d = 0; d < D; d += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + d), _mm512_loadu_ps(b + d), acc);
        return hsum16(acc);
    }
#endif
    __m256 acc = _mm256_setzero_ps();
    for (int64_t d = 0; d < D; d += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + d), _mm256_loadu_ps(b + d), acc);
    const __m128 s = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(t, _mm_shuffle_ps(t, t, 1)));
}
static inline void axpy(float *y, float a, const float *x, int64_t D) {
#if defined(__AVX512F__)
    if (HYSPEC_WIDE(D)) {
        const __m512 va = _mm512_set1_ps(a);
        for (int64_t d = 0; d < D; d += 16)
            _mm512_storeu_ps(y + d, _mm512_fmadd_ps(va, _mm512_loadu_ps(x + d), _mm512_loadu_ps(y + d)));
        return;
    }
#endif
    const __m256 va = _mm256_set1_ps(a);
    for (int64_t d = 0; d < D; d += 8)
        _mm256_storeu_ps(y + d, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + d), _mm256_loadu_ps(y + d)));
}
static inline __m256 widen8(const uint16_t *p) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
}
/* the same operations as dot / axpy, with b / x widened from bf16 (exactly) as they are read */
static inline float dot_bf16(const float *a, const uint16_t *b, int64_t D) {
#if defined(__AVX512F__)
    if (HYSPEC_WIDE(D)) {
        __m512 acc = _mm512_setzero_ps();
        for (int64_t d = 0; d < D; d += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + d), widen16(b + d), acc);
        return hsum16(acc);
    }
#endif
    __m256 acc = _mm256_setzero_ps();
    for (int64_t d = 0; d < D; d += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + d), widen8(b + d), acc);
    const __m128 s = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(t, _mm_shuffle_ps(t, t, 1)));
}
static inline void axpy_bf16(float *y, float a, const uint16_t *x, int64_t D) {
#if defined(__AVX512F__)
    if (HYSPEC_WIDE(D)) {
        const __m512 va = _mm512_set1_ps(a);
        for (int64_t d = 0; d < D; d += 16)
            _mm512_storeu_ps(y + d, _mm512_fmadd_ps(va, widen16(x + d), _mm512_loadu_ps(y + d)));
        return;
    }
#endif
    const __m256 va = _mm256_set1_ps(a);
    for (int64_t d = 0; d < D; d += 8)
        _mm256_storeu_ps(y + d, _mm256_fmadd_ps(va, widen8(x + d), _mm256_loadu_ps(y + d)));
}
#else
static inline float dot(const float *a, const float *b, int64_t D) {
    float lane[8] = {0};
    for (int64_t d = 0; d < D; d += 8)
        for (int j = 0; j < 8; j++) lane[j] = fmaf(a[d + j], b[d + j], lane[j]);
    const float s0 = lane[0] + lane[4], s1 = lane[1] + lane[5], s2 = lane[2] + lane[6], s3 = lane[3] + lane[7];
    return (s0 + s2) + (s1 + s3);
}
static inline void axpy(float *y, float a, const float *x, int64_t D) {
    for (int64_t d = 0; d < D; d++) y[d] = fmaf(a, x[d], y[d]);
}
static inline float dot_bf16(const float *a, const uint16_t *b, int64_t D) {
    float lane[8] = {0};
    for (int64_t d = 0; d < D; d += 8)
        for (int j = 0; j < 8; j++) lane[j] = fmaf(a[d + j], bf16_to_f32(b[d + j]), lane[j]);
    const float s0 = lane[0] + lane[4], s1 = lane[1] + lane[5], s2 = lane[2] + lane[6], s3 = lane[3] + lane[7];
    return (s0 + s2) + (s1 + s3);
}
static inline void axpy_bf16(float *y, float a, const uint16_t *x, int64_t D) {
    for (int64_t d = 0; d < D; d++) y[d] = fmaf(a, bf16_to_f32(x[d]), y[d]);
}
#endif

#if defined(__AVX512F__)
/* The sums of sixteen vectors' lanes, each in hsum16's order operand for operand (halves added down to one
 * lane), as one vector: lane k holds a[k]'s sum.  A transpose done by the additions themselves: 15 adds and 30
 * shuffles for sixteen sums, where sixteen hsum16 calls take 64 dependent operations. */
static inline __m512 hsum16x16(const __m512 a[16]) {
    __m512 h[8], s[4], t[2];
    for (int p = 0; p < 8; p++) /* h = [a lanes 0-7 + 8-15 | b lanes 0-7 + 8-15] */
        h[p] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * p], a[2 * p + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm512_shuffle_f32x4(a[2 * p], a[2 * p + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    for (int q = 0; q < 4; q++) /* 128-bit lane j: key 4q + j's h[0..3] + h[4..7] */
        s[q] = _mm512_add_ps(_mm512_shuffle_f32x4(h[2 * q], h[2 * q + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                             _mm512_shuffle_f32x4(h[2 * q], h[2 * q + 1], _MM_SHUFFLE(3, 1, 3, 1)));
    for (int r = 0; r < 2; r++) /* lane j: [s0 + s2, s1 + s3] of keys 8r + j and 8r + 4 + j */
        t[r] = _mm512_add_ps(_mm512_shuffle_ps(s[2 * r], s[2 * r + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm512_shuffle_ps(s[2 * r], s[2 * r + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    /* element 4j + m: t0 + t1 of key 4m + j; then each key to its own lane */
    const __m512 f = _mm512_add_ps(_mm512_shuffle_ps(t[0], t[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                   _mm512_shuffle_ps(t[0], t[1], _MM_SHUFFLE(3, 1, 3, 1)));
    return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), f);
}

/* The n scores of one (row, head), D = 16 * ND: key s at element offset at[s] of kc (its head's offset
 * already in kc).  Each key's dot product is dot()'s (sixteen lanes, FMAs in d order), sixteen keys at a
 * time summed by hsum16x16 (hsum16's additions), times scale: every score has the bits dot() * scale gives,
 * with the sixteen keys' loads and FMAs independent of each other.  at[] holds 15 valid entries past n. */
static inline __attribute__((always_inline)) void scores_wide(const int ND, const int BF, const float *qv, const void *kc,
                                                              const int64_t *at, int64_t n, float scale, float *score,
                                                              const int prefetch) {
    __m512 qr[8];
    for (int c = 0; c < ND; c++) qr[c] = _mm512_loadu_ps(qv + 16 * c);
    const __m512 vs = _mm512_set1_ps(scale);
    for (int64_t s0 = 0; s0 < n; s0 += 16) {
        __m512 a[16];
        for (int k = 0; k < 16; k++) {
            const int64_t o = at[s0 + k];
            if (prefetch && s0 + 16 + k < n) {
                const char *p = BF ? (const char *)((const uint16_t *)kc + at[s0 + 16 + k]) : (const char *)((const float *)kc + at[s0 + 16 + k]);
                for (int c = 0; c < ND * (BF ? 32 : 64); c += 64) _mm_prefetch(p + c, _MM_HINT_T0);
            }
            a[k] = _mm512_setzero_ps();
            for (int c = 0; c < ND; c++)
                a[k] = _mm512_fmadd_ps(qr[c], BF ? widen16((const uint16_t *)kc + o + 16 * c) : _mm512_loadu_ps((const float *)kc + o + 16 * c), a[k]);
        }
        const __m512 r = _mm512_mul_ps(hsum16x16(a), vs);
        if (n - s0 >= 16) _mm512_storeu_ps(score + s0, r);
        else _mm512_mask_storeu_ps(score + s0, (__mmask16)((1u << (n - s0)) - 1), r);
    }
}

/* The softmax and the weighted value sum of one (row, head) for D = 16 * ND (SmolLM2: 64), given its n
 * scores: the maximum over sixteen lanes (exact in any order), exp, the sum in sixteen lanes then hsum16,
 * and the ND accumulators of the output kept in registers across the value rows (in memory, every axpy
 * waited on the previous one's store: at context 200 the attention was a quarter of a 3-row verification).
 * The order is fixed by n alone, so a row computes the same in a decode step and in a verification. */
static inline __attribute__((always_inline)) void softmax_pv_wide(const int ND, const int BF, float *score, int64_t n,
                                                                  const int64_t *at, const void *vc, float *o) {
    __m512 mv = _mm512_set1_ps(-INFINITY);
    int64_t s = 0;
    for (; s + 16 <= n; s += 16) mv = _mm512_max_ps(mv, _mm512_loadu_ps(score + s));
    float m = _mm512_reduce_max_ps(mv);
    for (; s < n; s++) m = score[s] > m ? score[s] : m;
    for (s = 0; s < n; s++) score[s] -= m;
    vexp_array(score, score, n);
    __m512 tv = _mm512_setzero_ps();
    for (s = 0; s + 16 <= n; s += 16) tv = _mm512_add_ps(tv, _mm512_loadu_ps(score + s));
    if (s < n) tv = _mm512_add_ps(tv, _mm512_maskz_loadu_ps((__mmask16)((1u << (n - s)) - 1), score + s));
    const float total = hsum16(tv);
    __m512 acc[8];
    for (int k = 0; k < ND; k++) acc[k] = _mm512_setzero_ps();
    for (s = 0; s < n; s++) {
        if (s + 4 < n) {
            const char *p4 = BF ? (const char *)((const uint16_t *)vc + at[s + 4]) : (const char *)((const float *)vc + at[s + 4]);
            for (int k = 0; k < ND * (BF ? 32 : 64); k += 64) _mm_prefetch(p4 + k, _MM_HINT_T0);
        }
        const __m512 p = _mm512_set1_ps(score[s]);
        for (int k = 0; k < ND; k++)
            acc[k] = _mm512_fmadd_ps(p, BF ? widen16((const uint16_t *)vc + at[s] + 16 * k)
                                           : _mm512_loadu_ps((const float *)vc + at[s] + 16 * k), acc[k]);
    }
    const __m512 inv = _mm512_set1_ps(1.0f / total);
    for (int k = 0; k < ND; k++) _mm512_storeu_ps(o + 16 * k, _mm512_mul_ps(acc[k], inv));
}
#endif

#if defined(__AVX2__) && defined(__FMA__) && !defined(__AVX512F__)
/* AVX2 without AVX-512 (Zen 3, Haswell .. Alder Lake): the operations of dot / axpy above, reorganised so that
 * one (row, head) no longer waits on itself.  In a 1024-token prefill of SmolLM2 on a Zen 3 VM the attention was
 * 28 % of the time: each key's hsum was six dependent operations, and axpy kept the output in memory, so every
 * value row waited for the previous row's store. */

/* [a lanes 0-3 + 4-7 | b lanes 0-3 + 4-7]: the first addition of dot's horizontal sum, for two keys */
static inline __m256 fold_pair(__m256 a, __m256 b) {
    return _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20), _mm256_permute2f128_ps(a, b, 0x31));
}
/* the second, for four keys: halves [s0 + s2, s1 + s3 of k0, then of k2 | the same of k1, then of k3] */
static inline __m256 fold_quad(__m256 s01, __m256 s23) {
    return _mm256_add_ps(_mm256_shuffle_ps(s01, s23, _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm256_shuffle_ps(s01, s23, _MM_SHUFFLE(3, 2, 3, 2)));
}

/* The scores of one (row, head) for D = 8 * ND (ND <= 8: q stays in registers): each key's dot product is dot()'s
 * (eight lanes, FMAs in d order, then (s0 + s2) + (s1 + s3) of s_j = lane j + lane j + 4), eight keys at a time
 * with their horizontal sums done together by fold_pair / fold_quad and one last addition, times scale: every
 * score has the bits dot() * scale gives.  at[] holds 15 valid entries past n and score 16 spare floats, so the
 * last group of eight reads real cache entries and writes past n harmlessly. */
static inline __attribute__((always_inline)) void scores_avx2(const int ND, const int BF, const float *qv, const void *kc,
                                                              const int64_t *at, int64_t n, float scale, float *score) {
    __m256 qr[8];
    for (int c = 0; c < ND; c++) qr[c] = _mm256_loadu_ps(qv + 8 * c);
    const __m256 vs = _mm256_set1_ps(scale);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7); /* [k0 k2 k4 k6 | k1 k3 k5 k7] to key order */
    for (int64_t s0 = 0; s0 < n; s0 += 8) {
        __m256 t[2];
        for (int half = 0; half < 2; half++) {
            __m256 a[4];
            for (int k = 0; k < 4; k++) {
                const int64_t o = at[s0 + 4 * half + k];
                a[k] = _mm256_setzero_ps();
                for (int c = 0; c < ND; c++)
                    a[k] = _mm256_fmadd_ps(qr[c], BF ? widen8((const uint16_t *)kc + o + 8 * c)
                                                     : _mm256_loadu_ps((const float *)kc + o + 8 * c), a[k]);
            }
            t[half] = fold_quad(fold_pair(a[0], a[1]), fold_pair(a[2], a[3])); /* keys 4 half + (0, 2 | 1, 3) */
        }
        const __m256 f = _mm256_add_ps(_mm256_shuffle_ps(t[0], t[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                       _mm256_shuffle_ps(t[0], t[1], _MM_SHUFFLE(3, 1, 3, 1)));
        _mm256_storeu_ps(score + s0, _mm256_mul_ps(_mm256_permutevar8x32_ps(f, order), vs));
    }
}

/* The softmax and the weighted value sum of one (row, head) for D = 8 * ND (ND <= 8), as the generic loop below
 * computes them: the maximum (exact in any order: eight lanes), exp, the sum in position order (a scalar chain,
 * now run beside the value rows instead of before them), each output element's FMAs in position order (the
 * accumulators in registers instead of memory), and one division. */
static inline __attribute__((always_inline)) void softmax_pv_avx2(const int ND, const int BF, float *score, int64_t n,
                                                                  const int64_t *at, const void *vc, float *o) {
    __m256 mv = _mm256_set1_ps(-INFINITY);
    int64_t s = 0;
    for (; s + 8 <= n; s += 8) mv = _mm256_max_ps(_mm256_loadu_ps(score + s), mv); /* a NaN score is skipped */
    float lanes[8], m = -INFINITY;
    _mm256_storeu_ps(lanes, mv);
    for (int j = 0; j < 8; j++) m = lanes[j] > m ? lanes[j] : m;
    for (; s < n; s++) m = score[s] > m ? score[s] : m;
    for (s = 0; s < n; s++) score[s] -= m;
    vexp_array(score, score, n);
    float total = 0.0f;
    __m256 acc[8];
    for (int c = 0; c < ND; c++) acc[c] = _mm256_setzero_ps();
    for (s = 0; s < n; s++) {
        if (s + 4 < n) {
            const char *p4 = BF ? (const char *)((const uint16_t *)vc + at[s + 4]) : (const char *)((const float *)vc + at[s + 4]);
            for (int c = 0; c < ND * (BF ? 16 : 32); c += 64) _mm_prefetch(p4 + c, _MM_HINT_T0);
        }
        total += score[s];
        const __m256 p = _mm256_set1_ps(score[s]);
        for (int c = 0; c < ND; c++)
            acc[c] = _mm256_fmadd_ps(p, BF ? widen8((const uint16_t *)vc + at[s] + 8 * c)
                                           : _mm256_loadu_ps((const float *)vc + at[s] + 8 * c), acc[c]);
    }
    const __m256 inv = _mm256_set1_ps(1.0f / total);
    for (int c = 0; c < ND; c++) _mm256_storeu_ps(o + 8 * c, _mm256_mul_ps(acc[c], inv));
}
#define HYSPEC_AVX2_ROWS 1
#endif

/* q [T, Hq, D] contiguous; caches: element (block, offset, head, d) at block * sb + offset * so + head * sh + d;
 * block_tables [B, bt_stride] int32; seq_lens, query_lens [B] int32; row_seq, row_i [T] int32;
 * tree_mask [T, max_q] uint8 or NULL; out [T, Hq, D].  bf16 != 0: q, caches and out are bf16, else fp32.
 * positions [T] int64 and window: the sliding window (window 0: none, positions unread).
 * Returns 0, or -2 when out of memory. */
static int paged_attention_rows(const void *q, int64_t T, int64_t Hq, int64_t D, const void *kc, const void *vc,
                                int64_t sb, int64_t so, int64_t sh, int64_t block_size, int64_t Hkv,
                                const int32_t *block_tables, int64_t bt_stride, const int32_t *seq_lens,
                                const int32_t *query_lens, const int32_t *row_seq, const int32_t *row_i,
                                const uint8_t *tree_mask, int64_t max_q, float scale, void *out, int bf16,
                                const int64_t *positions, int64_t window) {
    int64_t max_len = 1;
    for (int64_t t = 0; t < T; t++)
        if (seq_lens[row_seq[t]] > max_len) max_len = seq_lens[row_seq[t]];
    const int64_t group = Hq / Hkv;
    int failed = 0;
#pragma omp parallel
    {
        /* at[s]: where the s-th entry row t sees starts in a cache (page and slot, no head), built once per row
         * for all its heads; 16 spare entries so a batch of sixteen keys never reads past the array */
        float *score = malloc(sizeof(float) * (size_t)(max_len + 16));
        int64_t *at = malloc(sizeof(int64_t) * (size_t)(max_len + 16));
        float *qw = malloc(sizeof(float) * (size_t)D), *acc = malloc(sizeof(float) * (size_t)D);
        int64_t at_row = -1, n = 0;
        if (!score || !at || !qw || !acc) {
#pragma omp atomic write
            failed = 1;
        } else {
#pragma omp for schedule(static)
            for (int64_t th = 0; th < T * Hq; th++) {
                const int64_t t = th / Hq, h = th % Hq, kvh = h / group;
                if (t != at_row) { /* the entries row t sees, in position order, page by page */
                    const int64_t b = row_seq[t], i = row_i[t], len = seq_lens[b], ctx = len - query_lens[b];
                    const int32_t *table = block_tables + b * bt_stride;
                    const int64_t oldest = window > 0 ? positions[t] - window : INT64_MIN; /* positions <= it: out */
                    n = 0;
                    for (int64_t p0 = 0; p0 < len; p0 += block_size) {
                        const int64_t base = (int64_t)table[p0 / block_size] * sb, end = p0 + block_size < len ? p0 + block_size : len;
                        for (int64_t j = p0; j < end; j++) {
                            int64_t position = j;
                            if (j >= ctx) {
                                const int64_t k = j - ctx;
                                if (tree_mask ? !tree_mask[t * max_q + k] : k > i) continue;
                                if (window > 0) position = positions[t - i + k]; /* query row k of the sequence */
                            }
                            if (position <= oldest) continue;
                            at[n++] = base + (j - p0) * so;
                        }
                    }
                    for (int64_t s = n; s < n + 16; s++) at[s] = at[0]; /* read, never used */
                    at_row = t;
                }
                const float *qv = qw;
                if (bf16)
                    for (int64_t d = 0; d < D; d++) qw[d] = bf16_to_f32(((const uint16_t *)q)[(t * Hq + h) * D + d]);
                else
                    qv = (const float *)q + (t * Hq + h) * D;
                float *o = bf16 ? acc : (float *)out + (t * Hq + h) * D;
                const int64_t ho = kvh * sh;
                /* the first query head of a group brings its keys in from memory (the pages are not a stride the
                 * hardware prefetchers follow well); the group's other heads find them in L2 */
                const int first = h % group == 0;
                (void)first; /* read by the AVX-512 path only */
#if defined(__AVX512F__)
                if (D == 64 || D == 128) {
                    const float *kf = (const float *)kc + ho, *vf = (const float *)vc + ho;
                    const uint16_t *kh = (const uint16_t *)kc + ho, *vh = (const uint16_t *)vc + ho;
                    if (D == 64 && bf16) scores_wide(4, 1, qv, kh, at, n, scale, score, first), softmax_pv_wide(4, 1, score, n, at, vh, o);
                    else if (D == 64) scores_wide(4, 0, qv, kf, at, n, scale, score, first), softmax_pv_wide(4, 0, score, n, at, vf, o);
                    else if (bf16) scores_wide(8, 1, qv, kh, at, n, scale, score, first), softmax_pv_wide(8, 1, score, n, at, vh, o);
                    else scores_wide(8, 0, qv, kf, at, n, scale, score, first), softmax_pv_wide(8, 0, score, n, at, vf, o);
                    if (bf16)
                        for (int64_t d = 0; d < D; d++) ((uint16_t *)out)[(t * Hq + h) * D + d] = f32_to_bf16(o[d]);
                    continue;
                }
#endif
#if defined(HYSPEC_AVX2_ROWS)
                if (D == 64 || D == 32) {
                    const float *kf = (const float *)kc + ho, *vf = (const float *)vc + ho;
                    const uint16_t *kh = (const uint16_t *)kc + ho, *vh = (const uint16_t *)vc + ho;
                    if (D == 64 && bf16) scores_avx2(8, 1, qv, kh, at, n, scale, score), softmax_pv_avx2(8, 1, score, n, at, vh, o);
                    else if (D == 64) scores_avx2(8, 0, qv, kf, at, n, scale, score), softmax_pv_avx2(8, 0, score, n, at, vf, o);
                    else if (bf16) scores_avx2(4, 1, qv, kh, at, n, scale, score), softmax_pv_avx2(4, 1, score, n, at, vh, o);
                    else scores_avx2(4, 0, qv, kf, at, n, scale, score), softmax_pv_avx2(4, 0, score, n, at, vf, o);
                    if (bf16)
                        for (int64_t d = 0; d < D; d++) ((uint16_t *)out)[(t * Hq + h) * D + d] = f32_to_bf16(o[d]);
                    continue;
                }
#endif
                for (int64_t s = 0; s < n; s++)
                    score[s] = (bf16 ? dot_bf16(qv, (const uint16_t *)kc + at[s] + ho, D) : dot(qv, (const float *)kc + at[s] + ho, D))
                               * scale;
                float m = -INFINITY;
                for (int64_t s = 0; s < n; s++) m = score[s] > m ? score[s] : m;
                for (int64_t s = 0; s < n; s++) score[s] -= m;
                vexp_array(score, score, n);
                float total = 0.0f;
                for (int64_t s = 0; s < n; s++) total += score[s];
                for (int64_t d = 0; d < D; d++) o[d] = 0.0f;
                for (int64_t s = 0; s < n; s++) {
                    if (bf16) axpy_bf16(o, score[s], (const uint16_t *)vc + at[s] + ho, D);
                    else axpy(o, score[s], (const float *)vc + at[s] + ho, D);
                }
                const float inv = 1.0f / total;
                for (int64_t d = 0; d < D; d++) o[d] *= inv;
                if (bf16)
                    for (int64_t d = 0; d < D; d++) ((uint16_t *)out)[(t * Hq + h) * D + d] = f32_to_bf16(o[d]);
            }
        }
        free(score);
        free(at);
        free(qw);
        free(acc);
    }
    return failed ? -2 : 0;
}

int hyspec_paged_attention(const void *q, int64_t T, int64_t Hq, int64_t D, const void *kc, const void *vc,
                           int64_t sb, int64_t so, int64_t sh, int64_t block_size, int64_t Hkv,
                           const int32_t *block_tables, int64_t bt_stride, const int32_t *seq_lens,
                           const int32_t *query_lens, const int32_t *row_seq, const int32_t *row_i,
                           const uint8_t *tree_mask, int64_t max_q, float scale, void *out, int bf16) {
    return paged_attention_rows(q, T, Hq, D, kc, vc, sb, so, sh, block_size, Hkv, block_tables, bt_stride, seq_lens,
                           query_lens, row_seq, row_i, tree_mask, max_q, scale, out, bf16, NULL, 0);
}

/* hyspec_paged_attention with a sliding window (see the top of this file) */
int hyspec_paged_attention_windowed(const void *q, int64_t T, int64_t Hq, int64_t D, const void *kc, const void *vc,
                                    int64_t sb, int64_t so, int64_t sh, int64_t block_size, int64_t Hkv,
                                    const int32_t *block_tables, int64_t bt_stride, const int32_t *seq_lens,
                                    const int32_t *query_lens, const int32_t *row_seq, const int32_t *row_i,
                                    const uint8_t *tree_mask, int64_t max_q, float scale, void *out, int bf16,
                                    const int64_t *positions, int64_t window) {
    return paged_attention_rows(q, T, Hq, D, kc, vc, sb, so, sh, block_size, Hkv, block_tables, bt_stride, seq_lens,
                           query_lens, row_seq, row_i, tree_mask, max_q, scale, out, bf16, positions, window);
}
