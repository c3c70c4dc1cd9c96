/* Times hyspec_paged_attention over SmolLM2-135M's 30 layers (9 query heads, 3 KV heads, D = 64, fp32 caches,
 * 16-token pages, pages shuffled) for one decode row and for a T-row verification tree at a given context, and
 * prints a checksum of the outputs' bits, so two builds of the kernel can be compared for identical results.
 *     attn_rows CTX T ROUNDS    (built by attn_rows.sh against a given paged_attention.c) */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
int hyspec_paged_attention(const void *q, int64_t T, int64_t Hq, int64_t D, const void *kc, const void *vc,
                           int64_t sb, int64_t so, int64_t sh, int64_t block_size, int64_t Hkv,
                           const int32_t *block_tables, int64_t bt_stride, const int32_t *seq_lens,
                           const int32_t *query_lens, const int32_t *row_seq, const int32_t *row_i,
                           const uint8_t *tree_mask, int64_t max_q, float scale, void *out, int bf16);
enum { L = 30, HQ = 9, HKV = 3, D = 64, BS = 16 };
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + 1e-9 * t.tv_nsec; }
static float frand(uint64_t *s) { *s = *s * 6364136223846793005ull + 1442695040888963407ull; return (float)((*s >> 40) & 0xffff) / 32768.0f - 1.0f; }

static double run(int ctx, int T, int rounds, uint64_t *sum) {
    const int len = ctx + T, pages = (len + BS - 1) / BS + 1;
    const int64_t so = HKV * D, sb = BS * so, per_layer = (int64_t)pages * sb;
    float *kc = malloc(sizeof(float) * per_layer * L), *vc = malloc(sizeof(float) * per_layer * L);
    float *q = malloc(sizeof(float) * T * HQ * D), *out = malloc(sizeof(float) * T * HQ * D);
    int32_t *table = malloc(sizeof(int32_t) * pages), seq_len = len, qlen = T, *row_seq = calloc(T, 4), *row_i = malloc(4 * T);
    uint8_t *mask = calloc((size_t)T * T, 1);
    uint64_t s = 42;
    for (int64_t i = 0; i < per_layer * L; i++) kc[i] = frand(&s), vc[i] = frand(&s);
    for (int i = 0; i < T * HQ * D; i++) q[i] = 2.0f * frand(&s);
    for (int p = 0; p < pages; p++) table[p] = (p * 7 + 3) % pages;  /* pages out of order, as a pool hands them out */
    for (int t = 0; t < T; t++) {
        row_i[t] = t;
        mask[t * T + t] = 1;
        if (t) { const int parent = (t - 1) / 2; for (int k = 0; k < T; k++) mask[t * T + k] |= mask[parent * T + k]; } /* a binary tree */
    }
    double best = 1e9;
    for (int r = 0; r < rounds; r++) {
        const double t0 = now();
        for (int l = 0; l < L; l++)
            hyspec_paged_attention(q, T, HQ, D, kc + l * per_layer, vc + l * per_layer, sb, so, D, BS, HKV, table, pages,
                                   &seq_len, &qlen, row_seq, row_i, T > 1 ? mask : NULL, T, 0.125f, out, 0);
        const double dt = now() - t0;
        best = dt < best ? dt : best;
    }
    for (int i = 0; i < T * HQ * D; i++) { uint32_t b; memcpy(&b, out + i, 4); *sum = *sum * 1099511628211ull ^ b; }
    free(kc), free(vc), free(q), free(out), free(table), free(row_seq), free(row_i), free(mask);
    return best;
}

int main(int argc, char **argv) {
    const int ctx = argc > 1 ? atoi(argv[1]) : 300, T = argc > 2 ? atoi(argv[2]) : 1, rounds = argc > 3 ? atoi(argv[3]) : 50;
    uint64_t sum = 1469598103934665603ull;
    const double t = run(ctx, T, rounds, &sum);
    printf("ctx %4d T %2d: 30 layers %.3f ms (best of %d)  bits %016llx\n", ctx, T, t * 1e3, rounds, (unsigned long long)sum);
    return 0;
}
