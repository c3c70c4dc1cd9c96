/* One matrix shape through hyspec_qgemm, M rows of x, one thread or more (OMP_NUM_THREADS): the best of 15
 * passes over `mats` distinct random matrices (1: in cache; 100: ~55 MB, from memory), ns per block of one
 * output row, and a hash of every output bit (variants that claim bit-identity must print the same hash).
 * Built by run.sh against a given qgemm.c:  gcc -O3 -march=native -fopenmp -DQGEMM_C='"path"' one_row.c */
#include QGEMM_C
#include <stdio.h>
#include <time.h>
static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}
int main(int argc, char **argv) {
    if (argc < 6) return fprintf(stderr, "usage: qtype K N mats M\n"), 2;
    const int qtype = atoi(argv[1]), nm = atoi(argv[4]), M = atoi(argv[5]);
    const int64_t K = atol(argv[2]), N = atol(argv[3]), bs = qblock_bytes(qtype), mb = N * (K / 32) * bs;
    uint8_t *w = aligned_alloc(64, (mb * nm + 63) / 64 * 64);
    srand(1);
    for (int64_t i = 0; i < mb * nm; i++) w[i] = (uint8_t)rand();
    for (int64_t i = 0; i < N * (K / 32) * nm; i++) { /* finite fp16 scales: d > 0, Q4_1's m < 0 */
        uint16_t h = 0x2c00 | (rand() & 0x3ff);
        memcpy(w + i * bs, &h, 2);
        h = 0xac00 | (rand() & 0x3ff);
        if (qtype == Q4_1) memcpy(w + i * bs + 2, &h, 2);
    }
    float *x = aligned_alloc(64, M * K * 4), *y = aligned_alloc(64, (size_t)M * N * nm * 4);
    for (int64_t i = 0; i < M * K; i++) x[i] = (rand() % 1000) / 1000.0f - 0.5f;
    double best = 1e9;
    for (int rep = 0; rep < 15; rep++) {
        const double t = now();
        for (int j = 0; j < nm; j++) hyspec_qgemm(qtype, x, M, K, w + j * mb, N, y + (int64_t)j * M * N);
        best = now() - t < best ? now() - t : best;
    }
    uint64_t hash = 1469598103934665603ULL;
    for (int64_t i = 0; i < (int64_t)M * N * nm; i++) {
        uint32_t u;
        memcpy(&u, y + i, 4);
        hash = (hash ^ u) * 1099511628211ULL;
    }
    printf("qtype %d K %ld N %ld mats %d M %d: %.2f ns/block  %.1f GB/s  hash %016lx\n", qtype, (long)K, (long)N, nm,
           M, best / ((double)N * (K / 32) * nm) * 1e9, mb * nm / best / 1e9, (unsigned long)hash);
    return 0;
}
