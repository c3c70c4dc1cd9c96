/* dense_gemm.c (bf16 or fp32) on SmolLM2-135M's fused shapes: 30 layers x (qkv 960x576, o 576x576, gate_up
 * 3072x576, down 576x1536) and the 49152 x 576 head, M rows of x, best of 10 passes, weights from memory (30
 * distinct layers, 213 MB + the 57 MB head in bf16), with the GB/s the weights were read at.
 *     dense_rows DTYPE(0 fp32, 1 bf16) M ...  (built by dense_rows.sh) */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
int hyspec_dense_gemm(int dtype, const void *x, int64_t M, int64_t K, const void *w, int64_t N, const void *bias, void *y);
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
int main(int argc, char **argv) {
    const int dt = argc > 1 ? atoi(argv[1]) : 1, es = dt ? 2 : 4;
    int64_t sh[4][2] = {{960, 576}, {576, 576}, {3072, 576}, {576, 1536}};
    void *W[30][4];
    double bytes = 0;
    for (int l = 0; l < 30; l++)
        for (int j = 0; j < 4; j++) {
            const int64_t n = sh[j][0] * sh[j][1];
            uint16_t *b = malloc(n * es);
            for (int64_t i = 0; i < n * es / 2; i++) b[i] = 0x3c00 + (rand() & 0x3ff) - 0x200; /* small values either way */
            W[l][j] = b, bytes += n * es;
        }
    uint16_t *H = malloc(49152 * 576 * es);
    for (int64_t i = 0; i < 49152 * 576 * es / 2; i++) H[i] = 0x3c00 + (rand() & 0x3ff) - 0x200;
    float *x = malloc(16 * 3072 * 4), *y = malloc(16 * 49152 * 4);
    for (int i = 0; i < 16 * 3072; i++) x[i] = (rand() % 1000 - 500) * 1e-3f;
    if (dt) for (int i = 0; i < 16 * 3072; i++) ((uint16_t *)x)[i] = 0x3c00 + (rand() & 0xff);
    for (int a = 2; a < argc; a++) {
        const int M = atoi(argv[a]);
        double bl = 1e9, bh = 1e9;
        for (int it = 0; it < 10; it++) {
            const double t0 = now();
            for (int l = 0; l < 30; l++)
                for (int j = 0; j < 4; j++) hyspec_dense_gemm(dt, x, M, sh[j][1], W[l][j], sh[j][0], NULL, y);
            const double t1 = now();
            hyspec_dense_gemm(dt, x, M, 576, H, 49152, NULL, y);
            const double t2 = now();
            bl = t1 - t0 < bl ? t1 - t0 : bl, bh = t2 - t1 < bh ? t2 - t1 : bh;
        }
        printf("%s M=%d layers %6.2f ms (%.1f GB/s) head %5.2f ms (%.1f GB/s)\n", dt ? "bf16" : "fp32", M, bl * 1e3,
               bytes / bl * 1e-9, bh * 1e3, 49152.0 * 576 * es / bh * 1e-9);
    }
    return 0;
}
