/*
 * Paged attention on the CPU for fp32 caches, straight from the pages (no gathered copy of the cache).
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
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
static inline float dot(const float *a, const float *b, int64_t D) { /* D % 8 == 0 */
    __m256 acc = _mm256_setzero_ps();
    for (int64_t d = 0; d < D; d += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + d), _mm256_loadu_ps(b + d), acc);
    const __m128 s = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(t, _mm_shuffle_ps(t, t, 1)));
}
static inline void axpy(float *y, float a, const float *x, int64_t D) {
    const __m256 va = _mm256_set1_ps(a);
    for (int64_t d = 0; d < D; d += 8)
        _mm256_storeu_ps(y + d, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + d), _mm256_loadu_ps(y + d)));
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
#endif

/* q [T, Hq, D] contiguous; caches: element (block, offset, head, d) at block * sb + offset * so + head * sh + d;
 * block_tables [B, bt_stride] int32; seq_lens, query_lens [B] int32; row_seq, row_i [T] int32;
 * tree_mask [T, max_q] uint8 or NULL; out [T, Hq, D].  Returns 0, or -2 when out of memory. */
int hyspec_paged_attention(const float *q, int64_t T, int64_t Hq, int64_t D, const float *kc, const float *vc,
                           int64_t sb, int64_t so, int64_t sh, int64_t block_size, int64_t Hkv,
                           const int32_t *block_tables, int64_t bt_stride, const int32_t *seq_lens,
                           const int32_t *query_lens, const int32_t *row_seq, const int32_t *row_i,
                           const uint8_t *tree_mask, int64_t max_q, float scale, float *out) {
    int64_t max_len = 1;
    for (int64_t t = 0; t < T; t++)
        if (seq_lens[row_seq[t]] > max_len) max_len = seq_lens[row_seq[t]];
    const int64_t group = Hq / Hkv;
    int failed = 0;
#pragma omp parallel
    {
        float *score = malloc(sizeof(float) * (size_t)max_len);
        int32_t *slot = malloc(sizeof(int32_t) * (size_t)max_len);
        if (!score || !slot) {
#pragma omp atomic write
            failed = 1;
        } else {
#pragma omp for schedule(static)
            for (int64_t th = 0; th < T * Hq; th++) {
                const int64_t t = th / Hq, h = th % Hq, kvh = h / group;
                const int64_t b = row_seq[t], i = row_i[t], len = seq_lens[b], ctx = len - query_lens[b];
                const int32_t *table = block_tables + b * bt_stride;
                const float *qv = q + (t * Hq + h) * D;
                int64_t n = 0;
                for (int64_t j = 0; j < len; j++) {
                    if (j >= ctx) {
                        const int64_t k = j - ctx;
                        if (tree_mask ? !tree_mask[t * max_q + k] : k > i) continue;
                    }
                    slot[n] = (int32_t)j;
                    const float *kv = kc + (int64_t)table[j / block_size] * sb + (j % block_size) * so + kvh * sh;
                    score[n++] = dot(qv, kv, D) * scale;
                }
                float m = -INFINITY;
                for (int64_t s = 0; s < n; s++) m = score[s] > m ? score[s] : m;
                float total = 0.0f;
                for (int64_t s = 0; s < n; s++) {
                    score[s] = expf(score[s] - m);
                    total += score[s];
                }
                float *o = out + (t * Hq + h) * D;
                for (int64_t d = 0; d < D; d++) o[d] = 0.0f;
                for (int64_t s = 0; s < n; s++) {
                    const int64_t j = slot[s];
                    axpy(o, score[s], vc + (int64_t)table[j / block_size] * sb + (j % block_size) * so + kvh * sh, D);
                }
                const float inv = 1.0f / total;
                for (int64_t d = 0; d < D; d++) o[d] *= inv;
            }
        }
        free(score);
        free(slot);
    }
    return failed ? -2 : 0;
}
