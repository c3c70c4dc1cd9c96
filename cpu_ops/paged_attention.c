/*
 * Paged attention on the CPU for fp32 or bf16 caches, straight from the pages (no gathered copy of the cache).
 *
 * Semantics are the reference op's (core/ops/attention.py): packed query rows, row t belongs to
 * sequence row_seq[t] as its query row_i[t]; the sequence's committed context is c = seq_len - n and
 * query i sees every context entry j < c and new entry c + k iff k <= i (causal) or, with a tree,
 * iff tree_mask[t, k].
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
/* The softmax and the weighted value sum of one (row, head) for D = 16 * ND (SmolLM2: 64), given its n
 * scores: the maximum over sixteen lanes (exact in any order), exp, the sum in sixteen lanes then hsum16,
 * and the ND accumulators of the output kept in registers across the value rows (in memory, every axpy
 * waited on the previous one's store: at context 200 the attention was a quarter of a 3-row verification).
 * The order is fixed by n alone, so a row computes the same in a decode step and in a verification. */
static inline __attribute__((always_inline)) void softmax_pv_wide(const int ND, const int BF, float *score, int64_t n,
                                                                  const int32_t *slot, const int32_t *table,
                                                                  int64_t block_size, int64_t sb, int64_t so,
                                                                  const void *vc, int64_t head_off, float *o) {
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
        const int64_t j = slot[s];
        const int64_t at = (int64_t)table[j / block_size] * sb + (j % block_size) * so + head_off;
        if (s + 4 < n) {
            const int64_t j4 = slot[s + 4];
            const int64_t a4 = (int64_t)table[j4 / block_size] * sb + (j4 % block_size) * so + head_off;
            const char *p4 = BF ? (const char *)((const uint16_t *)vc + a4) : (const char *)((const float *)vc + a4);
            for (int k = 0; k < ND * (BF ? 32 : 64); k += 64) _mm_prefetch(p4 + k, _MM_HINT_T0);
        }
        const __m512 p = _mm512_set1_ps(score[s]);
        for (int k = 0; k < ND; k++)
            acc[k] = _mm512_fmadd_ps(p, BF ? widen16((const uint16_t *)vc + at + 16 * k)
                                           : _mm512_loadu_ps((const float *)vc + at + 16 * k), acc[k]);
    }
    const __m512 inv = _mm512_set1_ps(1.0f / total);
    for (int k = 0; k < ND; k++) _mm512_storeu_ps(o + 16 * k, _mm512_mul_ps(acc[k], inv));
}
#endif

/* q [T, Hq, D] contiguous; caches: element (block, offset, head, d) at block * sb + offset * so + head * sh + d;
 * block_tables [B, bt_stride] int32; seq_lens, query_lens [B] int32; row_seq, row_i [T] int32;
 * tree_mask [T, max_q] uint8 or NULL; out [T, Hq, D].  bf16 != 0: q, caches and out are bf16, else fp32.
 * Returns 0, or -2 when out of memory. */
int hyspec_paged_attention(const void *q, int64_t T, int64_t Hq, int64_t D, const void *kc, const void *vc,
                           int64_t sb, int64_t so, int64_t sh, int64_t block_size, int64_t Hkv,
                           const int32_t *block_tables, int64_t bt_stride, const int32_t *seq_lens,
                           const int32_t *query_lens, const int32_t *row_seq, const int32_t *row_i,
                           const uint8_t *tree_mask, int64_t max_q, float scale, void *out, int bf16) {
    int64_t max_len = 1;
    for (int64_t t = 0; t < T; t++)
        if (seq_lens[row_seq[t]] > max_len) max_len = seq_lens[row_seq[t]];
    const int64_t group = Hq / Hkv;
    int failed = 0;
#pragma omp parallel
    {
        float *score = malloc(sizeof(float) * (size_t)max_len);
        int32_t *slot = malloc(sizeof(int32_t) * (size_t)max_len);
        float *qw = malloc(sizeof(float) * (size_t)D), *acc = malloc(sizeof(float) * (size_t)D);
        if (!score || !slot || !qw || !acc) {
#pragma omp atomic write
            failed = 1;
        } else {
#pragma omp for schedule(static)
            for (int64_t th = 0; th < T * Hq; th++) {
                const int64_t t = th / Hq, h = th % Hq, kvh = h / group;
                const int64_t b = row_seq[t], i = row_i[t], len = seq_lens[b], ctx = len - query_lens[b];
                const int32_t *table = block_tables + b * bt_stride;
                const float *qv = qw;
                if (bf16)
                    for (int64_t d = 0; d < D; d++) qw[d] = bf16_to_f32(((const uint16_t *)q)[(t * Hq + h) * D + d]);
                else
                    qv = (const float *)q + (t * Hq + h) * D;
                int64_t n = 0;
                for (int64_t j = 0; j < len; j++) {
                    if (j >= ctx) {
                        const int64_t k = j - ctx;
                        if (tree_mask ? !tree_mask[t * max_q + k] : k > i) continue;
                    }
                    slot[n] = (int32_t)j;
                    const int64_t at = (int64_t)table[j / block_size] * sb + (j % block_size) * so + kvh * sh;
#if defined(__AVX512F__)
                    if (j + 4 < len) { /* the pages are not a stride the hardware prefetchers follow well */
                        const int64_t j4 = j + 4;
                        const int64_t a4 = (int64_t)table[j4 / block_size] * sb + (j4 % block_size) * so + kvh * sh;
                        const char *p4 = bf16 ? (const char *)((const uint16_t *)kc + a4) : (const char *)((const float *)kc + a4);
                        for (int64_t off = 0; off < D * (bf16 ? 2 : 4); off += 64) _mm_prefetch(p4 + off, _MM_HINT_T0);
                    }
#endif
                    score[n++] = (bf16 ? dot_bf16(qv, (const uint16_t *)kc + at, D) : dot(qv, (const float *)kc + at, D))
                                 * scale;
                }
                float *o = bf16 ? acc : (float *)out + (t * Hq + h) * D;
#if defined(__AVX512F__)
                if (D == 64 || D == 128) {
                    if (D == 64 && bf16) softmax_pv_wide(4, 1, score, n, slot, table, block_size, sb, so, vc, kvh * sh, o);
                    else if (D == 64) softmax_pv_wide(4, 0, score, n, slot, table, block_size, sb, so, vc, kvh * sh, o);
                    else if (bf16) softmax_pv_wide(8, 1, score, n, slot, table, block_size, sb, so, vc, kvh * sh, o);
                    else softmax_pv_wide(8, 0, score, n, slot, table, block_size, sb, so, vc, kvh * sh, o);
                    if (bf16)
                        for (int64_t d = 0; d < D; d++) ((uint16_t *)out)[(t * Hq + h) * D + d] = f32_to_bf16(o[d]);
                    continue;
                }
#endif
                float m = -INFINITY;
                for (int64_t s = 0; s < n; s++) m = score[s] > m ? score[s] : m;
                for (int64_t s = 0; s < n; s++) score[s] -= m;
                vexp_array(score, score, n);
                float total = 0.0f;
                for (int64_t s = 0; s < n; s++) total += score[s];
                for (int64_t d = 0; d < D; d++) o[d] = 0.0f;
                for (int64_t s = 0; s < n; s++) {
                    const int64_t j = slot[s];
                    const int64_t at = (int64_t)table[j / block_size] * sb + (j % block_size) * so + kvh * sh;
                    if (bf16) axpy_bf16(o, score[s], (const uint16_t *)vc + at, D);
                    else axpy(o, score[s], (const float *)vc + at, D);
                }
                const float inv = 1.0f / total;
                for (int64_t d = 0; d < D; d++) o[d] *= inv;
                if (bf16)
                    for (int64_t d = 0; d < D; d++) ((uint16_t *)out)[(t * Hq + h) * D + d] = f32_to_bf16(o[d]);
            }
        }
        free(score);
        free(slot);
        free(qw);
        free(acc);
    }
    return failed ? -2 : 0;
}
