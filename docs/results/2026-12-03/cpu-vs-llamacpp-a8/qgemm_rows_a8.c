/* qgemm (fp32 activations, cpu_ops/qgemm.c) against qgemm_a8 (8-bit activations, cpu_ops/qgemm_a8.c) on
 * SmolLM2-135M's fused shapes: 30 layers x (qkv 960x576, o 576x576, gate_up 3072x576, down 576x1536) in Q4_1
 * and the 49152 x 576 Q8_0 head, M = 1..8 rows of x, best of 20 passes, weights from memory (30 distinct
 * layer copies, 66 MB + the 30 MB head, past the 32 MiB L3).  Random codes and small fp16 scales.
 * Argument: 0 = qgemm, 1 = qgemm_a8 (the same matrices repacked by hyspec_qgemm_a8_pack). */
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
int hyspec_qgemm(int qtype, const float *x, int64_t M, int64_t K, const uint8_t *w, int64_t N, float *y);
int hyspec_qgemm_a8(int qtype, const float *x, int64_t M, int64_t K, const uint8_t *w, int64_t N, float *y);
int hyspec_qgemm_a8_pack(int qtype, const uint8_t *w, int64_t N, int64_t K, uint8_t *out);
int64_t hyspec_qgemm_a8_row_bytes(int qtype, int64_t K);
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
static uint8_t *mk(int qtype, int64_t n, int64_t k) {
    int bs = qtype == 0 ? 18 : qtype == 1 ? 20 : 34; int64_t nb = n * (k / 32); uint8_t *b = malloc(nb * bs);
    for (int64_t i = 0; i < nb * bs; i++) b[i] = rand();
    for (int64_t i = 0; i < nb; i++) {
        uint16_t d = 0x2000 + (rand() & 0x3ff); memcpy(b + i * bs, &d, 2);
        if (qtype == 1) { uint16_t m = 0xA000 + (rand() & 0x3ff); memcpy(b + i * bs + 2, &m, 2); }
    }
    return b;
}
static uint8_t *pk(int qtype, uint8_t *b, int64_t n, int64_t k) {
    uint8_t *o = malloc(n * hyspec_qgemm_a8_row_bytes(qtype, k)); hyspec_qgemm_a8_pack(qtype, b, n, k, o); free(b); return o;
}
int main(int argc, char **argv) {
    int a8 = argc > 1 && atoi(argv[1]);
    int (*gemm)(int, const float *, int64_t, int64_t, const uint8_t *, int64_t, float *) = a8 ? hyspec_qgemm_a8 : hyspec_qgemm;
    int64_t sh[4][2] = {{960, 576}, {576, 576}, {3072, 576}, {576, 1536}};
    uint8_t *W[30][4];
    for (int l = 0; l < 30; l++)
        for (int j = 0; j < 4; j++) { W[l][j] = mk(1, sh[j][0], sh[j][1]); if (a8) W[l][j] = pk(1, W[l][j], sh[j][0], sh[j][1]); }
    uint8_t *H = mk(2, 49152, 576); if (a8) H = pk(2, H, 49152, 576);
    float *x = malloc(8 * 1536 * 4), *y = malloc(8 * 49152 * 4);
    for (int i = 0; i < 8 * 1536; i++) x[i] = (rand() % 1000 - 500) * 1e-3f;
    int Ms[] = {1, 2, 3, 4, 6, 8};
    for (int mi = 0; mi < 6; mi++) {
        int M = Ms[mi]; double bl = 1e9, bh = 1e9;
        for (int it = 0; it < 20; it++) {
            double t0 = now();
            for (int l = 0; l < 30; l++) for (int j = 0; j < 4; j++) gemm(1, x, M, sh[j][1], W[l][j], sh[j][0], y);
            double t1 = now(); gemm(2, x, M, 576, H, 49152, y); double t2 = now();
            if (t1 - t0 < bl) bl = t1 - t0;
            if (t2 - t1 < bh) bh = t2 - t1;
        }
        printf("%s M=%d layers %6.2f ms head %5.2f total %6.2f\n", a8 ? "a8  " : "fp32", M, bl * 1e3, bh * 1e3, (bl + bh) * 1e3);
    }
    return 0;
}
