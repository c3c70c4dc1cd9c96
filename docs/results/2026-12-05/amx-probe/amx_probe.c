/*
 * Probe: would AMX-INT8 make verification rows cheap on this CPU?  SmolLM2-135M's 30 layers of Q4_1
 * projections (q 576, k 192, v 192, o 576, gate 1536, up 1536 x K 576; down 576 x K 1536), random codes,
 * times M rows of 8-bit activations, two ways in one process on the same threads:
 *
 *   vnni  hyspec's a8 kernel as shipped (cpu_ops/qgemm_a8.c, included): lanes are blocks, one output at a time
 *   amx   a tile kernel: 16 outputs x up to 16 rows per tile, TDPBSUD per 32-element block, then per block
 *         acc[m][n] = fma(d[n] * dx[m], isum, acc); acc = fma(mq[n], sx[m], acc)  -- lanes are outputs, the
 *         blocks summed in order, so no horizontal sum; the integer sums are the same exact ones as a8's,
 *         only the fp32 order differs (so it is a different, equally batch-invariant, arithmetic).
 *         Weights stay the GGUF's 20 bytes a block (nibbles packed, fp16 d and m), repacked per 16 outputs
 *         and unpacked to bytes in L1 before each tile load; two blocks are in flight (tmm0-2, tmm3-5).
 *         Earlier variants measured in the same session: codes stored unpacked (twice the bytes) ran
 *         0.48-0.59x vnni at 1-8 rows, 0.75x at 16, 1.30x at 64; with a deeper prefetch 0.63x / 1.13x / 1.46x.
 *
 * The amx result is checked bit for bit against a scalar reference of its own arithmetic, and against
 * the vnni result (different fp32 order: relative difference reported).
 *
 *   gcc -O3 -march=native -fopenmp amx_probe.c -o amx_probe -lm && ./amx_probe
 */
#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "../../../../cpu_ops/qgemm_a8.c"

#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

typedef struct { uint8_t palette, start; uint8_t res[14]; uint16_t colsb[16]; uint8_t rows[16]; } tilecfg;

static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }

/* amx layout, per tile of 16 outputs and block b: 512 bytes of codes u ([k/4][n][4], what TDPBSUD's B
 * reads), then d[16] and m[16] as fp32 (converted exactly from the fp16 of the GGUF) */
enum { AMX_TILE_BYTES = 256 + 64 }; /* the GGUF's own 20 bytes a block */
#ifndef AMX_AHEAD
#define AMX_AHEAD 6
#endif

static void amx_pack_q4_1(const uint8_t *w, int64_t N, int64_t K, uint8_t *out) {
    const int64_t nb = K / 32;
    for (int64_t t = 0; t < N / 16; t++)
        for (int64_t b = 0; b < nb; b++) {
            uint8_t *o = out + (t * nb + b) * AMX_TILE_BYTES;
            for (int j = 0; j < 16; j++) {
                const uint8_t *blk = w + ((t * 16 + j) * nb + b) * 20;
                for (int c = 0; c < 4; c++)
                    for (int i = 0; i < 4; i++)
                        o[c * 64 + j * 4 + i] = (uint8_t)(a8_code(A8_Q4_1, blk, 4 * c + i) | a8_code(A8_Q4_1, blk, 16 + 4 * c + i) << 4);
                memcpy(o + 256 + 2 * j, blk, 2), memcpy(o + 288 + 2 * j, blk + 2, 2);
            }
        }
}

/* x quantized as a8 does (a8_quantize_block), kept row-major: q [M][K] int8, dx / sx [M][K/32] */
static void quantize_rows(const float *x, int64_t M, int64_t K, int8_t *q, float *dx, float *sx) {
    for (int64_t r = 0; r < M; r++)
        for (int64_t b = 0; b < K / 32; b++)
            a8_quantize_block(x + r * K + b * 32, q + r * K + b * 32, dx + r * (K / 32) + b, sx + r * (K / 32) + b);
}

static void amx_gemm(const int8_t *q, const float *dx, const float *sx, int64_t M, int64_t K, const uint8_t *w,
                     int64_t N, float *y) {
    const int64_t nb = K / 32;
#pragma omp parallel
    {
        tilecfg cfg;
        int rows_cfg = -1;
        int32_t C[16 * 16] __attribute__((aligned(64)));
        uint8_t U[2][512] __attribute__((aligned(64)));
        const __m512i nib = _mm512_set1_epi8(0x0f);
#pragma omp for schedule(static)
        for (int64_t t = 0; t < N / 16; t++) {
            for (int64_t m0 = 0; m0 < M; m0 += 16) {
                const int R = M - m0 < 16 ? (int)(M - m0) : 16;
                if (R != rows_cfg) {
                    memset(&cfg, 0, sizeof cfg);
                    cfg.palette = 1;
                    cfg.rows[0] = R, cfg.colsb[0] = 64; /* C: R x 16 int32 */
                    cfg.rows[1] = R, cfg.colsb[1] = 32; /* A: R x one block of int8 */
                    cfg.rows[2] = 8, cfg.colsb[2] = 64; /* B: 8 x (16 outputs x 4 codes) */
                    cfg.rows[3] = R, cfg.colsb[3] = 64, cfg.rows[4] = R, cfg.colsb[4] = 32; /* the second block's */
                    cfg.rows[5] = 8, cfg.colsb[5] = 64;
                    _tile_loadconfig(&cfg);
                    rows_cfg = R;
                }
                __m512 acc[16];
                for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps();
                const uint8_t *wt = w + t * nb * AMX_TILE_BYTES;
                /* two blocks in flight (C in tmm0 / tmm3, A in tmm1 / tmm4, B in tmm2 / tmm5): the second
                 * block's TDPBSUD runs while the first's sums go through the fp32 epilogue (K / 32 is even
                 * for every projection of the model) */
                for (int64_t b = 0; b < nb; b += 2) {
                    const uint8_t *wb = wt + b * AMX_TILE_BYTES;
                    for (int off = 0; off < 2 * AMX_TILE_BYTES; off += 64)
                        _mm_prefetch((const char *)(wb + AMX_AHEAD * AMX_TILE_BYTES + off), _MM_HINT_T0);
                    _tile_zero(0);
                    _tile_zero(3);
                    _tile_loadd(1, q + m0 * K + b * 32, K);
                    for (int h = 0; h < 2; h++)
                        for (int c = 0; c < 4; c++) {
                            const __m512i v = _mm512_loadu_si512((const void *)(wb + h * AMX_TILE_BYTES + c * 64));
                            _mm512_store_si512((void *)(U[h] + c * 64), _mm512_and_si512(v, nib));
                            _mm512_store_si512((void *)(U[h] + (c + 4) * 64), _mm512_and_si512(_mm512_srli_epi16(v, 4), nib));
                        }
                    _tile_loadd(2, U[0], 64);
                    _tile_loadd(4, q + m0 * K + b * 32 + 32, K);
                    _tile_loadd(5, U[1], 64);
                    _tile_dpbsud(0, 1, 2);
                    _tile_dpbsud(3, 4, 5);
                    for (int h = 0; h < 2; h++) {
                        if (h == 0) _tile_stored(0, C, 64); else _tile_stored(3, C, 64);
                        const uint8_t *wh = wb + h * AMX_TILE_BYTES;
                        const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(wh + 256)));
                        const __m512 mq = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(wh + 288)));
                        for (int r = 0; r < R; r++) {
                            const int64_t i = (m0 + r) * nb + b + h;
                            const __m512 s = _mm512_cvtepi32_ps(_mm512_load_si512(C + 16 * r));
                            acc[r] = _mm512_fmadd_ps(_mm512_mul_ps(d, _mm512_set1_ps(dx[i])), s, acc[r]);
                            acc[r] = _mm512_fmadd_ps(mq, _mm512_set1_ps(sx[i]), acc[r]);
                        }
                    }
                }
                for (int r = 0; r < R; r++) _mm512_storeu_ps(y + (m0 + r) * N + t * 16, acc[r]);
            }
        }
        _tile_release();
    }
}

static void amx_reference(const int8_t *q, const float *dx, const float *sx, int64_t M, int64_t K, const uint8_t *w,
                          int64_t N, float *y) {
    const int64_t nb = K / 32;
    for (int64_t r = 0; r < M; r++)
        for (int64_t n = 0; n < N; n++) {
            float acc = 0.0f;
            for (int64_t b = 0; b < nb; b++) {
                const uint8_t *wb = w + ((n / 16) * nb + b) * AMX_TILE_BYTES;
                int32_t s = 0;
                for (int k = 0; k < 32; k++) {
                    const uint8_t byte = wb[((k % 16) / 4) * 64 + (n % 16) * 4 + k % 4];
                    s += (int32_t)(k < 16 ? byte & 15 : byte >> 4) * q[r * K + b * 32 + k];
                }
                const float d = a8_f16(wb + 256 + 2 * (n % 16)), mq = a8_f16(wb + 288 + 2 * (n % 16));
                acc = fmaf(d * dx[r * nb + b], (float)s, acc);
                acc = fmaf(mq, sx[r * nb + b], acc);
            }
            y[r * N + n] = acc;
        }
}

static uint16_t to_f16(float f) { return _cvtss_sh(f, 0); }

typedef struct { int64_t N, K; uint8_t *gguf, *vnni, *amx; } mat;

int main(int argc, char **argv) {
    if (syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)) { perror("AMX permission"); return 1; }
    const int layers = argc > 1 ? atoi(argv[1]) : 30;
    const int64_t shapes[7][2] = {{576, 576}, {192, 576}, {192, 576}, {576, 576}, {1536, 576}, {1536, 576}, {576, 1536}};
    mat *ms = calloc(layers * 7, sizeof(mat));
    srand(1);
    size_t vnni_bytes = 0, amx_bytes = 0;
    for (int i = 0; i < layers * 7; i++) {
        mat *m = &ms[i];
        m->N = shapes[i % 7][0], m->K = shapes[i % 7][1];
        const int64_t nb = m->N * m->K / 32;
        m->gguf = malloc(nb * 20);
        for (int64_t b = 0; b < nb; b++) {
            uint16_t d = to_f16(0.001f + 0.01f * (rand() % 100) / 100.0f), mm = to_f16(-0.08f * (rand() % 100) / 100.0f);
            memcpy(m->gguf + b * 20, &d, 2), memcpy(m->gguf + b * 20 + 2, &mm, 2);
            for (int k = 0; k < 16; k++) m->gguf[b * 20 + 4 + k] = rand();
        }
        const int64_t rb = hyspec_qgemm_a8_row_bytes(A8_Q4_1, m->K);
        m->vnni = aligned_alloc(64, m->N * rb);
        hyspec_qgemm_a8_pack(A8_Q4_1, m->gguf, m->N, m->K, m->vnni);
        m->amx = aligned_alloc(64, (size_t)(m->N / 16) * (m->K / 32) * AMX_TILE_BYTES);
        amx_pack_q4_1(m->gguf, m->N, m->K, m->amx);
        vnni_bytes += m->N * rb, amx_bytes += (size_t)(m->N / 16) * (m->K / 32) * AMX_TILE_BYTES;
    }
    printf("%d layers x 7 Q4_1 projections, %d threads; weights: vnni layout %.1f MB, amx layout %.1f MB\n", layers,
           omp_get_max_threads(), vnni_bytes / 1e6, amx_bytes / 1e6);
    const int Ms[] = {1, 2, 4, 8, 16, 32, 64};
    const int64_t KMAX = 1536, MMAX = 64;
    float *x = malloc(MMAX * KMAX * 4), *y1 = malloc(MMAX * 1536 * 4), *y2 = malloc(MMAX * 1536 * 4), *y3 = malloc(MMAX * 1536 * 4);
    int8_t *q = aligned_alloc(64, MMAX * KMAX);
    float *dx = malloc(MMAX * KMAX / 32 * 4), *sx = malloc(MMAX * KMAX / 32 * 4);
    for (int i = 0; i < MMAX * KMAX; i++) x[i] = (rand() % 2001 - 1000) / 500.0f;
    /* correctness: every shape at M = 19 (a full and a partial row tile) */
    double worst_rel = 0.0;
    int exact = 1;
    for (int s = 0; s < 7; s++) {
        mat *m = &ms[s];
        const int M = 19;
        quantize_rows(x, M, m->K, q, dx, sx);
        amx_gemm(q, dx, sx, M, m->K, m->amx, m->N, y1);
        amx_reference(q, dx, sx, M, m->K, m->amx, m->N, y2);
        hyspec_qgemm_a8(A8_Q4_1, x, M, m->K, m->vnni, m->N, y3);
        for (int64_t i = 0; i < M * m->N; i++) {
            exact &= memcmp(&y1[i], &y2[i], 4) == 0;
            const double rel = fabs(y1[i] - y3[i]) / (fabs(y3[i]) + 1e-3);
            if (rel > worst_rel) worst_rel = rel;
        }
    }
    printf("amx == its scalar reference bit for bit: %s; largest relative difference to the vnni kernel: %.2e\n",
           exact ? "yes" : "NO", worst_rel);
    printf("%4s %12s %12s %8s   (ms for all projections of the model, median of 15)\n", "M", "vnni", "amx", "ratio");
    for (unsigned mi = 0; mi < sizeof Ms / sizeof *Ms; mi++) {
        const int M = Ms[mi];
        double tv[15], ta[15];
        for (int rep = 0; rep < 17; rep++) {
            double t0 = now();
            for (int i = 0; i < layers * 7; i++) hyspec_qgemm_a8(A8_Q4_1, x, M, ms[i].K, ms[i].vnni, ms[i].N, y3);
            double t1 = now();
            for (int i = 0; i < layers * 7; i++) {
                quantize_rows(x, M, ms[i].K, q, dx, sx);
                amx_gemm(q, dx, sx, M, ms[i].K, ms[i].amx, ms[i].N, y1);
            }
            double t2 = now();
            if (rep >= 2) tv[rep - 2] = t1 - t0, ta[rep - 2] = t2 - t1;
        }
        for (int i = 0; i < 15; i++)
            for (int j = i + 1; j < 15; j++) {
                if (tv[j] < tv[i]) { double t = tv[i]; tv[i] = tv[j]; tv[j] = t; }
                if (ta[j] < ta[i]) { double t = ta[i]; ta[i] = ta[j]; ta[j] = t; }
            }
        printf("%4d %12.3f %12.3f %8.2f\n", M, tv[7] * 1e3, ta[7] * 1e3, tv[7] / ta[7]);
    }
    return 0;
}
