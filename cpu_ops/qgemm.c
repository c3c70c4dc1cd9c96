/*
 * y[m, n] = sum_k x[m, k] * w[n, k] over llama.cpp's own blocks (Q4_0, Q4_1, Q8_0, Q5_0), fp32 activations.
 * (Q5_1, Q4_K, Q5_K and Q6_K: kquants.c, included below and dispatched from hyspec_qgemm.)
 *
 * Built at first use by hyspec.cpu_ops.qgemm (gcc -O3 -march=native -fopenmp) and called through
 * ctypes.  The weights are read as the GGUF stores them, 32 per block:
 *   Q4_0  fp16 d, 16 bytes of nibbles       w = d * (q - 8)
 *   Q4_1  fp16 d, fp16 m, 16 bytes nibbles  w = d * q + m
 *   Q8_0  fp16 d, 32 int8                   w = d * q
 *   Q5_0  fp16 d, 4 bytes qh, 16 bytes      w = d * (q - 16), q = nibble | bit j of qh << 4
 * (element j of a 4-bit block is the low nibble of byte j, element j + 16 its high nibble).  Q5_0 goes through
 * Q8_0's code paths with q - 16 as its codes: its result is, bit for bit, Q8_0's on the same d and codes (a Q5_0
 * block re-encodes exactly as a Q8_0 one).  Most of a Q4_K_M file's matrices are Q5_0: summed as Q8_0 is, rather
 * than as kquants.c sums dequantized weights, its rows of verification cost a third less.
 *
 * The file's values are used as they are (fp16 scales read exactly, no requantization) and the
 * activations stay fp32.  The AVX-512 path dequantizes each block to the fp32 values gguf's own dequantize
 * gives (a 16-entry table per 4-bit block, see dequant) and sums w * x in sixteen lanes; the AVX2 and
 * portable paths use sum_k x_k w_k = d * sum_k q_k x_k + m * sum_k x_k per block, so codes are never
 * scaled one by one.  All sums are fp32 in a fixed order, so the result differs from an fp32 product with
 * the dequantized matrix only by rounding (tests/test_cpu_ops_qgemm.py).  Nothing depends on how many
 * rows share a call or which thread computes them: a row's result is the same alone or in a batch, which
 * is what lets speculative verification reproduce plain decoding bit for bit.
 *
 * Verification rows are cheap where the kernel shares work between them: the AVX-512 tile dequantizes
 * a block once for up to eight rows of x and loads a row of x once for up to four output rows.  On a
 * 2-core Zen 4 VM, SmolLM2-135M's projections and Q8_0 head from memory took 5.33 ms for one row, 9.03 ms
 * for four and 18.21 ms for eight with the per-row code-times-x formula; 4.22, 7.28 and 12.77 ms with the
 * tile and its prefetch sweep (interleaved in one run: docs/results/2026-12-03/cpu-vs-llamacpp-zen4).
 *
 * Threads: OpenMP over blocks of four output rows (AVX2 with many rows of x: up to 32, see MANY_OUTPUTS;
 * AVX-512 from PANEL_ROWS rows: panels of up to 16, see qgemm_panel).  Loaded after torch, the process's libgomp.so.1
 * is torch's own, so the kernel shares torch's thread pool instead of competing with it.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(_OPENMP)
#include <omp.h>
static inline int omp_threads(void) { return omp_get_max_threads(); }
#else
static inline int omp_threads(void) { return 1; }
#endif

#if defined(__AVX512F__) && defined(__F16C__)
#include <immintrin.h>
#define HYSPEC_AVX512 1 /* 16 lanes: two vectors per 32-weight block (twice AVX2's work per instruction) */
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define HYSPEC_AVX2 1
#endif

/* Q5_0 is computed as Q8_0 is: its centred 5-bit codes are the int8 codes of a Q8_0 block with the same d */
enum { Q4_0 = 0, Q4_1 = 1, Q8_0 = 2, Q5_0 = 3 };
/* the types with a per-block offset m (Q4_0's is -8 d); Q8_0 and Q5_0 have none */
static inline int has_min(const int qtype) { return qtype == Q4_0 || qtype == Q4_1; }
static inline int64_t qblock_bytes(const int qtype) {
    return qtype == Q4_0 ? 18 : qtype == Q4_1 ? 20 : qtype == Q5_0 ? 22 : 34;
}
enum { MANY_ROWS = 2 }; /* AVX2: from this many rows of x, rows_block_many (codes converted once per chunk) */
enum { ROW_CHUNK = 8 };  /* rows of x rows_block_many keeps hot at a time */
/* rows_block_many's outputs per task: a chunk of x is read from L1 by this many output rows before the next
 * chunk (with four, every output block streamed all of x from L3: a 1024-token prefill ran at 5 cycles a
 * block and row, 3.5 with x in cache).  At most this many; fewer where the threads need more tasks. */
enum { MANY_OUTPUTS = 32 };
/* How far ahead the kernels ask for weights (software prefetch).  With the weights in L3 or memory the
 * hardware prefetchers fell behind: on a 2-core Sapphire Rapids VM, SmolLM2's 120 projections read from
 * memory took 7.2 ms for one row of x where they take 4.7 ms from cache (8 KiB ahead: 4.6 ms), and 2 rows
 * 1.66x one row's time, 3 rows 2.7x (4 KiB ahead: 1.3x and 1.55x).  A prefetch never faults, so asking
 * past the end of the matrix is harmless. */
enum { PREFETCH_BYTES = 4096, PREFETCH_BYTES_ONE_ROW = 8192 };

int hyspec_qgemm_version(void) { return 2; }

#if defined(HYSPEC_AVX512) || defined(HYSPEC_AVX2)
/* Q5_0 / Q5_1's 32 codes as bytes, in element order: the nibbles of qs (low nibbles elements 0..15, high 16..31)
 * with bit j of qh as bit 4 of element j.  Centred (Q5_0): the code minus 16 as a signed byte, which is the nibble
 * where the bit is set and the nibble with 0xF0 set where it is clear. */
static inline __attribute__((always_inline)) __m256i q5_codes(const uint8_t *qh4, const uint8_t *qs,
                                                              const int centred) {
    uint32_t qh;
    memcpy(&qh, qh4, 4);
    const __m128i raw = _mm_loadu_si128((const __m128i *)qs), mask = _mm_set1_epi8(0x0F);
    const __m256i nib = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(raw, 4), mask), _mm_and_si128(raw, mask));
    /* byte j of `bytes` is the byte of qh holding bit j; its bit (j % 8) is selected by a per-byte mask */
    const __m256i bytes = _mm256_shuffle_epi8(_mm256_set1_epi32((int)qh),
                                              _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                                               2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3));
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(bytes, bit), bit);
    return _mm256_or_si256(nib, centred ? _mm256_andnot_si256(set, _mm256_set1_epi8((char)0xF0))
                                        : _mm256_and_si256(set, _mm256_set1_epi8(16)));
}
#endif

#if defined(HYSPEC_AVX512)
const char *hyspec_qgemm_isa(void) { return "avx512f+f16c"; }

static inline float f16(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

#include "hsum16.h"

/* The 32 weights of one block in fp32 (elements 0..15 in w[0], 16..31 in w[1]), the values gguf's own
 * dequantize gives: Q4_0 d * (q - 8) and Q8_0 d * q are exact products (an fp16 times a small integer
 * fits fp32's mantissa); Q4_1 d * q + m is one fma, rounded once like gguf's exact d * q plus m.
 * 4-bit codes go through a 16-entry table of the block's sixteen possible values: vpermps reads only the
 * low four bits of each index, so the widened bytes index their low nibble as they are and their high
 * nibble after one shift (4 vector operations and a table fma, against 9 to convert and scale codes). */
static inline __attribute__((always_inline)) void dequant(const int qtype, const int few, const uint8_t *b,
                                                          __m512 w[2]) {
    if (qtype == Q8_0) {
        const __m512 d = _mm512_set1_ps(f16(b));
        w[0] = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(b + 2)))), d);
        w[1] = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(b + 18)))), d);
        return;
    }
    const __m512 iota = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    if (qtype == Q5_0 && !few) { /* Q8_0's arithmetic on the centred codes */
        const __m512 d = _mm512_set1_ps(f16(b));
        const __m256i q = q5_codes(b + 2, b + 6, 1);
        w[0] = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_castsi256_si128(q))), d);
        w[1] = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_extracti128_si256(q, 1))), d);
        return;
    }
    if (qtype == Q5_0) {
        /* The same values, d * (q - 16), from a 32-entry table (two registers): the nibble indexes it and the
         * fifth bit, set from qh through a mask register, picks the upper half.  Its entries are the exact
         * products the conversion above gives, with fewer shuffles: 7-10 % off the one- and two-row loops
         * (scripts/bench_qgemm_types.py).  Tiles of many rows keep the conversion: the table's registers
         * would push their accumulators out of the register file. */
        const __m512 d = _mm512_set1_ps(f16(b));
        const __m512 lower = _mm512_mul_ps(_mm512_sub_ps(iota, _mm512_set1_ps(16.0f)), d), upper = _mm512_mul_ps(iota, d);
        uint32_t qh;
        memcpy(&qh, b + 2, 4);
        const __m512i q = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(b + 6))), fifth = _mm512_set1_epi32(16);
        const __m512i lo = _mm512_and_si512(q, _mm512_set1_epi32(0x0F)), hi = _mm512_srli_epi32(q, 4);
        w[0] = _mm512_permutex2var_ps(lower, _mm512_mask_or_epi32(lo, (__mmask16)qh, lo, fifth), upper);
        w[1] = _mm512_permutex2var_ps(lower, _mm512_mask_or_epi32(hi, (__mmask16)(qh >> 16), hi, fifth), upper);
        return;
    }
    const __m512 table = qtype == Q4_1
                             ? _mm512_fmadd_ps(iota, _mm512_set1_ps(f16(b)), _mm512_set1_ps(f16(b + 2)))
                             : _mm512_mul_ps(_mm512_sub_ps(iota, _mm512_set1_ps(8.0f)), _mm512_set1_ps(f16(b)));
    const __m512i q = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(b + (qtype == Q4_1 ? 4 : 2))));
    w[0] = _mm512_permutexvar_ps(q, table);                       /* low nibbles: elements 0..15 */
    w[1] = _mm512_permutexvar_ps(_mm512_srli_epi32(q, 4), table); /* high nibbles: 16..31 */
}

/* NB output rows (from w, G blocks each) against R rows of x, both compile-time with NB * R <= 16: the
 * accumulators, NB * 2 weight vectors and 2 of x fit the 32 registers.  Per block each output row is
 * dequantized once for all R rows, and each row of x loaded once for all NB outputs.  Every (output, row)
 * pair does the same operations whatever NB, R or M are: sixteen lane sums, w[0] * x[0..15] then
 * w[1] * x[16..31] per block in block order, then hsum16; so a row's result never depends on its batch. */
static inline __attribute__((always_inline)) void tile(const int qtype, const int NB, const int R, const float *x,
                                                       int64_t K, const uint8_t *w, float *y, int64_t N) {
    const int64_t G = K / 32, bs = qblock_bytes(qtype);
    const int ahead = R == 1 ? PREFETCH_BYTES_ONE_ROW : PREFETCH_BYTES;
    __m512 acc[4][8];
    for (int n = 0; n < NB; n++)
        for (int r = 0; r < R; r++) acc[n][r] = _mm512_setzero_ps();
    for (int64_t g = 0; g < G; g++) {
        __m512 wv[4][2];
        /* The NB rows' blocks are one contiguous region (NB * G * bs bytes): one prefetch sweep `ahead` bytes
         * on, at the rate the tile consumes it.  One prefetch per row and block asked for the same lines
         * several times and left lines out (a Q8_0 tile eats 136 bytes a block): on a Zen 4 VM the Q8_0 head
         * for one row took 1.68 ms that way, 0.93 ms with the sweep. */
        for (int64_t off = 0; off < NB * bs; off += 64)
            _mm_prefetch((const char *)(w + g * NB * bs + off + ahead), _MM_HINT_T0);
        for (int n = 0; n < NB; n++) dequant(qtype, NB * R <= 8, w + (n * G + g) * bs, wv[n]);
        for (int r = 0; r < R; r++) {
            __m512 x0 = _mm512_loadu_ps(x + r * K + 32 * g), x1 = _mm512_loadu_ps(x + r * K + 32 * g + 16);
            if (NB > 1) __asm__("" : "+v"(x0), "+v"(x1)); /* loaded once for the NB fmas (see panel_tile) */
            for (int n = 0; n < NB; n++) {
                acc[n][r] = _mm512_fmadd_ps(wv[n][0], x0, acc[n][r]);
                acc[n][r] = _mm512_fmadd_ps(wv[n][1], x1, acc[n][r]);
            }
        }
    }
    for (int n = 0; n < NB; n++)
        for (int r = 0; r < R; r++) y[r * N + n] = hsum16(acc[n][r]);
}

/* NB (1, 2 or 4) output rows against R (1..8) rows of x, through the tile of that shape */
static inline __attribute__((always_inline)) void tile_rn(const int qtype, const int NB, int R, const float *x,
                                                          int64_t K, const uint8_t *w, float *y, int64_t N) {
#define HYSPEC_TILE_R(NBC, RMAX)                                        \
    switch (R) {                                                        \
        case 1: tile(qtype, NBC, 1, x, K, w, y, N); break;              \
        case 2: tile(qtype, NBC, 2, x, K, w, y, N); break;              \
        case 3: tile(qtype, NBC, 3, x, K, w, y, N); break;              \
        case 4: tile(qtype, NBC, 4, x, K, w, y, N); break;              \
        case 5: tile(qtype, NBC, 5 < RMAX ? 5 : RMAX, x, K, w, y, N); break; \
        case 6: tile(qtype, NBC, 6 < RMAX ? 6 : RMAX, x, K, w, y, N); break; \
        case 7: tile(qtype, NBC, 7 < RMAX ? 7 : RMAX, x, K, w, y, N); break; \
        default: tile(qtype, NBC, RMAX, x, K, w, y, N); break;          \
    }
    if (NB == 4) { HYSPEC_TILE_R(4, 4) }
    else if (NB == 2) { HYSPEC_TILE_R(2, 8) }
    else { HYSPEC_TILE_R(1, 8) }
#undef HYSPEC_TILE_R
}

/* output rows n0 .. n0+NB-1 (NB <= 4) against every row of x, eight rows of x at a time (the output rows'
 * blocks stay in L1 between chunks): up to four rows in 4 x R tiles, more in two 2 x R tiles (the
 * dequantization is shared by more rows, the FMAs stay the same) */
static inline __attribute__((always_inline)) void output_rows_avx512(const int qtype, const float *x, int64_t M,
                                                                     int64_t K, const uint8_t *w, int64_t n0, int NB,
                                                                     float *y, int64_t N) {
    const int64_t rowbytes = K / 32 * qblock_bytes(qtype);
    for (int64_t m0 = 0; m0 < M; m0 += 8) {
        const int R = M - m0 < 8 ? (int)(M - m0) : 8;
        const float *xc = x + m0 * K;
        float *yc = y + m0 * N + n0;
        const uint8_t *wb = w + n0 * rowbytes;
        if (NB == 4 && R <= 4) tile_rn(qtype, 4, R, xc, K, wb, yc, N);
        else if (NB == 4) {
            tile_rn(qtype, 2, R, xc, K, wb, yc, N);
            tile_rn(qtype, 2, R, xc, K, wb + 2 * rowbytes, yc + 2, N);
        } else
            for (int i = 0; i < NB; i++) tile_rn(qtype, 1, R, xc, K, wb + i * rowbytes, yc + i, N);
    }
}

/* Many rows of x (prefill, long verification): each output row's blocks dequantized once into an fp32 panel for
 * every row of x, then 4 outputs x PANEL_TILE rows of x in 24 accumulators, fed from the panel and x alone.  The
 * tiles above dequantize a block again for every chunk of eight rows, and those conversions share the FMA ports:
 * with them Q5_0's 1536x576 matrix at 112 rows ran at ~36 G multiply-adds a second a core against ~59 G of fma peak.
 * Each (output, row) pair takes exactly tile's operations in tile's order (w[0] * x[0..15], then w[1] * x[16..31],
 * block by block, then hsum16) on the same dequantized values, so the results are the tile's, bit for bit. */
enum { PANEL_ROWS = 32, PANEL_TILE = 6 }; /* from 32 rows (at 16 the old tiles were 9 % faster, at 32 the panel 3 %) */

static inline __attribute__((always_inline)) void panel_tile(const int R, const float *wd, const float *x, int64_t K,
                                                             float *y, int64_t N, int NB) {
    __m512 acc[4][PANEL_TILE];
    for (int n = 0; n < 4; n++)
        for (int r = 0; r < R; r++) acc[n][r] = _mm512_setzero_ps();
    for (int64_t k = 0; k < K; k += 16) { /* k and k + 16: a block's two halves, in order */
        const __m512 w0 = _mm512_load_ps(wd + k), w1 = _mm512_load_ps(wd + K + k);
        const __m512 w2 = _mm512_load_ps(wd + 2 * K + k), w3 = _mm512_load_ps(wd + 3 * K + k);
        for (int r = 0; r < R; r++) {
            __m512 xv = _mm512_loadu_ps(x + r * K + k);
            /* in a register for all four fmas: GCC otherwise folds the load into each of them, four loads of
             * the same vector, and the loop runs on the load ports instead of the fma ones */
            __asm__("" : "+v"(xv));
            acc[0][r] = _mm512_fmadd_ps(w0, xv, acc[0][r]);
            acc[1][r] = _mm512_fmadd_ps(w1, xv, acc[1][r]);
            acc[2][r] = _mm512_fmadd_ps(w2, xv, acc[2][r]);
            acc[3][r] = _mm512_fmadd_ps(w3, xv, acc[3][r]);
        }
    }
    for (int r = 0; r < R; r++)
        for (int n = 0; n < NB; n++) y[r * N + n] = hsum16(acc[n][r]);
}

/* one function per tile height, R a compile-time constant in each (as kquants.c's kq_many_* functions) */
#define HYSPEC_PANEL_FN(R)                                                                                     \
    static __attribute__((noinline)) void panel_tile_##R(const float *wd, const float *x, int64_t K, float *y, \
                                                         int64_t N, int NB) {                                  \
        panel_tile(R, wd, x, K, y, N, NB);                                                                     \
    }
HYSPEC_PANEL_FN(1)
HYSPEC_PANEL_FN(2)
HYSPEC_PANEL_FN(3)
HYSPEC_PANEL_FN(4)
HYSPEC_PANEL_FN(5)
HYSPEC_PANEL_FN(6)
#undef HYSPEC_PANEL_FN

static inline void panel_rows(int R, const float *wd, const float *x, int64_t K, float *y, int64_t N, int NB) {
    switch (R) {
        case 1: panel_tile_1(wd, x, K, y, N, NB); break;
        case 2: panel_tile_2(wd, x, K, y, N, NB); break;
        case 3: panel_tile_3(wd, x, K, y, N, NB); break;
        case 4: panel_tile_4(wd, x, K, y, N, NB); break;
        case 5: panel_tile_5(wd, x, K, y, N, NB); break;
        default: panel_tile_6(wd, x, K, y, N, NB); break;
    }
}

/* output rows n0 .. n0+NB-1 of w dequantized into wd (rows K apart; rows NB..P-1 of a short last panel zero) */
static inline __attribute__((always_inline)) void panel_dequant(const int qtype, const uint8_t *w, int64_t K,
                                                                int64_t n0, int NB, int P, float *wd) {
    const int64_t G = K / 32, bs = qblock_bytes(qtype);
    for (int n = 0; n < P; n++) {
        const uint8_t *wr = w + (n0 + n) * G * bs;
        for (int64_t g = 0; g < G; g++) {
            __m512 v[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()};
            if (n < NB) {
                _mm_prefetch((const char *)(wr + g * bs + PREFETCH_BYTES), _MM_HINT_T0);
                dequant(qtype, 0, wr + g * bs, v);
            }
            _mm512_store_ps(wd + n * K + 32 * g, v[0]);
            _mm512_store_ps(wd + n * K + 32 * g + 16, v[1]);
        }
    }
}

/* x [M, K] against all N outputs: tasks of P output rows (a multiple of 4; the panel ~64 KiB), each dequantized once,
 * then x in chunks of MC rows (~256 KiB, kept in L2) passed over by the panel's groups of four.  -2: out of memory. */
static int qgemm_panel(const int qtype, const float *x, int64_t M, int64_t K, const uint8_t *w, int64_t N, float *y) {
    const int64_t threads = omp_threads();
    int64_t P = 16384 / K / 4 * 4;
    P = P < 4 ? 4 : P > 16 ? 16 : P;
    while (P > 4 && (N + P - 1) / P < 4 * threads) P -= 4; /* at least four tasks a thread */
    int64_t MC = 65536 / K / PANEL_TILE * PANEL_TILE;
    MC = MC < PANEL_TILE ? PANEL_TILE : MC;
    const int64_t ntasks = (N + P - 1) / P;
    int failed = 0;
#pragma omp parallel reduction(| : failed)
    {
        float *wd = aligned_alloc(64, (size_t)(P * K * sizeof(float) + 63) / 64 * 64);
        if (!wd) failed = 1;
#pragma omp for schedule(static)
        for (int64_t t = 0; t < ntasks; t++) {
            if (!wd) continue;
            const int64_t n0 = t * P;
            const int NB = N - n0 < P ? (int)(N - n0) : (int)P;
            switch (qtype) { /* one dequantization per block format */
                case Q4_0: panel_dequant(Q4_0, w, K, n0, NB, (int)P, wd); break;
                case Q4_1: panel_dequant(Q4_1, w, K, n0, NB, (int)P, wd); break;
                case Q5_0: panel_dequant(Q5_0, w, K, n0, NB, (int)P, wd); break;
                default: panel_dequant(Q8_0, w, K, n0, NB, (int)P, wd); break;
            }
            for (int64_t m0 = 0; m0 < M; m0 += MC) {
                const int64_t mend = m0 + MC < M ? m0 + MC : M;
                for (int i = 0; i < NB; i += 4) {
                    const int nb = NB - i < 4 ? NB - i : 4;
                    for (int64_t r0 = m0; r0 < mend; r0 += PANEL_TILE) {
                        const int R = mend - r0 < PANEL_TILE ? (int)(mend - r0) : PANEL_TILE;
                        panel_rows(R, wd + i * K, x + r0 * K, K, y + r0 * N + n0 + i, N, nb);
                    }
                }
            }
        }
        free(wd);
    }
    return failed ? -2 : 0;
}

#elif defined(HYSPEC_AVX2)
const char *hyspec_qgemm_isa(void) { return "avx2+fma+f16c"; }

static inline float f16(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

static inline float hsum(__m256 v) {
    const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1)); /* l0+l4 ... */
    const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));                                  /* +l2+l6 ... */
    return _mm_cvtss_f32(_mm_add_ss(t, _mm_shuffle_ps(t, t, 1)));
}

/* Q5_CLEAR[8 v + j]: 0xF0 where bit j of v is clear, else 0.  Widened with sign extension and ORed into a nibble, it
 * gives Q5_0's centred code (nibble - 16 where the fifth bit is clear): one widening from this 2 KiB table per eight
 * codes, where testing the bits in dword lanes took four vector operations on the one-row loop's critical ports. */
static uint8_t Q5_CLEAR[256 * 8] __attribute__((aligned(64)));
__attribute__((constructor)) static void q5_clear_init(void) {
    for (int v = 0; v < 256; v++)
        for (int j = 0; j < 8; j++) Q5_CLEAR[8 * v + j] = (v >> j) & 1 ? 0 : 0xF0;
}

/* the 32 codes of one block as four vectors of eight floats (q for Q4_0 / Q4_1, signed q for Q8_0, q - 16 for
 * Q5_0), element 8i + l in lane l of c[i].  Bytes are widened straight from the block (vpmovzxbd / vpmovsxbd with
 * a memory operand): widening them from a register first needed extracts and unpacks on the shuffle ports, which
 * were this loop's bottleneck.  The 4-bit codes of elements 8i..8i+7 and 16+8i..16+8i+7 are the low and high
 * nibbles of the same eight bytes, widened once. */
static inline __attribute__((always_inline)) void codes(const int qtype, const uint8_t *b, __m256 c[4]) {
    if (qtype == Q8_0) {
        for (int i = 0; i < 4; i++)
            c[i] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(b + 2 + 8 * i))));
        return;
    }
    const uint8_t *qs = b + (qtype == Q4_1 ? 4 : qtype == Q5_0 ? 6 : 2);
    const __m256i m4 = _mm256_set1_epi32(0x0F);
    __m256i q[4];
    for (int i = 0; i < 2; i++) {
        const __m256i bytes = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(qs + 8 * i)));
        q[i] = _mm256_and_si256(bytes, m4);
        q[i + 2] = _mm256_srli_epi32(bytes, 4);
    }
    if (qtype == Q5_0) /* byte i of qh holds the fifth bits of elements 8i..8i+7 */
        for (int i = 0; i < 4; i++)
            q[i] = _mm256_or_si256(q[i], _mm256_cvtepi8_epi32(
                                             _mm_loadl_epi64((const __m128i *)(Q5_CLEAR + 8 * b[2 + i]))));
    for (int i = 0; i < 4; i++) c[i] = _mm256_cvtepi32_ps(q[i]);
}

/* Output rows n0 .. n0+NB-1 (NB <= 4), two at a time, against every row of x.  Per block,
 *   sum_k x_k w_k = d * (sum_k q_k x_k) + m * (sum_k x_k)      (Q4_0: m = -8 d; Q8_0: m = 0)
 * so the codes are never scaled one by one: eight lanes of q*x per block are scaled by d into a
 * vector accumulator, and m times the block's precomputed sum of x (xs) goes into a scalar one.
 * The result is hsum(vector) + scalar, in that order. */
static inline __attribute__((always_inline)) void rows_block(const int qtype, const float *x, const float *xs,
                                                             int64_t M, int64_t K, const uint8_t *w, int64_t n0,
                                                             int NB, float *y, int64_t N) {
    const int64_t G = K / 32, bs = qblock_bytes(qtype);
    for (int i = 0; i < NB; i += 2) {
        const int two = NB - i >= 2;
        const uint8_t *w0 = w + (n0 + i) * G * bs, *w1 = two ? w0 + G * bs : w0;
        for (int64_t m = 0; m < M; m++) {
            const float *xr = x + m * K, *xsr = xs + m * G;
            __m256 a0 = _mm256_setzero_ps(), a1 = a0;
            float s0 = 0.0f, s1 = 0.0f;
            for (int64_t g = 0; g < G; g++) {
                const __m256 x0 = _mm256_loadu_ps(xr + 32 * g), x1 = _mm256_loadu_ps(xr + 32 * g + 8);
                const __m256 x2 = _mm256_loadu_ps(xr + 32 * g + 16), x3 = _mm256_loadu_ps(xr + 32 * g + 24);
                __m256 c[4];
                const uint8_t *b0 = w0 + g * bs, *b1 = w1 + g * bs;
                _mm_prefetch((const char *)(b0 + PREFETCH_BYTES_ONE_ROW), _MM_HINT_T0);
                _mm_prefetch((const char *)(b1 + PREFETCH_BYTES_ONE_ROW), _MM_HINT_T0);
                codes(qtype, b0, c);
                __m256 p = _mm256_fmadd_ps(c[1], x1, _mm256_mul_ps(c[0], x0));
                p = _mm256_fmadd_ps(c[3], x3, _mm256_fmadd_ps(c[2], x2, p));
                float d = f16(b0);
                a0 = _mm256_fmadd_ps(p, _mm256_set1_ps(d), a0);
                if (has_min(qtype)) s0 = __builtin_fmaf(qtype == Q4_1 ? f16(b0 + 2) : -8.0f * d, xsr[g], s0);
                codes(qtype, b1, c);
                p = _mm256_fmadd_ps(c[1], x1, _mm256_mul_ps(c[0], x0));
                p = _mm256_fmadd_ps(c[3], x3, _mm256_fmadd_ps(c[2], x2, p));
                d = f16(b1);
                a1 = _mm256_fmadd_ps(p, _mm256_set1_ps(d), a1);
                if (has_min(qtype)) s1 = __builtin_fmaf(qtype == Q4_1 ? f16(b1 + 2) : -8.0f * d, xsr[g], s1);
            }
            y[m * N + n0 + i] = hsum(a0) + s0;
            if (two) y[m * N + n0 + i + 1] = hsum(a1) + s1;
        }
    }
}

/* The same sums as rows_block for many rows of x (verification, prefill): one output row against R rows of x
 * (a compile-time count, so the accumulators stay in registers), the block's codes converted once for all R.
 * The scalar m * xs sums of the R rows run as the lanes of one vector (xst: block g's sums of the R rows in
 * lanes 0..7, see transposed_block_sums): lane r is the fma rows_block does for row r, one instruction for
 * eight rows instead of eight.  Every (output, row) pair goes through exactly the operations rows_block does,
 * in the same order: the results are equal. */
static inline __attribute__((always_inline)) void one_row_r(const int qtype, const int R, const float *x,
                                                            const float *xst, int64_t K, const uint8_t *wr,
                                                            float *y, int64_t N) {
    const int64_t G = K / 32, bs = qblock_bytes(qtype);
    __m256 acc[8], sc = _mm256_setzero_ps();
    for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
    for (int64_t g = 0; g < G; g++) {
        const uint8_t *b = wr + g * bs;
        _mm_prefetch((const char *)(b + PREFETCH_BYTES), _MM_HINT_T0);
        __m256 c[4];
        codes(qtype, b, c);
        const float d = f16(b);
        const __m256 vd = _mm256_set1_ps(d);
        for (int r = 0; r < R; r++) {
            const float *xg = x + r * K + 32 * g;
            __m256 p = _mm256_fmadd_ps(c[1], _mm256_loadu_ps(xg + 8), _mm256_mul_ps(c[0], _mm256_loadu_ps(xg)));
            p = _mm256_fmadd_ps(c[3], _mm256_loadu_ps(xg + 24), _mm256_fmadd_ps(c[2], _mm256_loadu_ps(xg + 16), p));
            acc[r] = _mm256_fmadd_ps(p, vd, acc[r]);
        }
        if (has_min(qtype))
            sc = _mm256_fmadd_ps(_mm256_set1_ps(qtype == Q4_1 ? f16(b + 2) : -8.0f * d), _mm256_loadu_ps(xst + 8 * g), sc);
    }
    float s[8];
    _mm256_storeu_ps(s, sc);
    for (int r = 0; r < R; r++) y[r * N] = hsum(acc[r]) + s[r];
}

/* xs[m, g]: the sum of block g of row m, in a fixed order */
static void block_sums(const float *x, int64_t M, int64_t K, float *xs) {
    for (int64_t i = 0; i < M * (K / 32); i++) {
        const float *b = x + i * 32;
        const __m256 v = _mm256_add_ps(_mm256_add_ps(_mm256_loadu_ps(b), _mm256_loadu_ps(b + 8)),
                                       _mm256_add_ps(_mm256_loadu_ps(b + 16), _mm256_loadu_ps(b + 24)));
        xs[i] = hsum(v);
    }
}

/* xst[c, g, r]: xs[8 c + r, g] (rows in chunks of ROW_CHUNK, block by block, zero past the last row): the
 * sums one_row_r reads as one vector per block */
static void transposed_block_sums(const float *xs, int64_t M, int64_t G, float *xst) {
    for (int64_t m0 = 0; m0 < M; m0 += ROW_CHUNK)
        for (int64_t g = 0; g < G; g++)
            for (int64_t r = 0; r < ROW_CHUNK; r++)
                xst[(m0 / ROW_CHUNK * G + g) * ROW_CHUNK + r] = m0 + r < M ? xs[(m0 + r) * G + g] : 0.0f;
}

#else /* portable: the same sums in the same order, without vectors */
const char *hyspec_qgemm_isa(void) { return "portable"; }

static inline float f16(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    const uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1F, man = h & 0x3FF;
    uint32_t bits;
    if (exp == 0) {
        if (man == 0) bits = sign;
        else { /* subnormal */
            int e = -1;
            uint32_t m = man;
            do { e++; m <<= 1; } while (!(m & 0x400));
            bits = sign | (uint32_t)(127 - 15 - e) << 23 | (m & 0x3FF) << 13;
        }
    } else if (exp == 31) bits = sign | 0x7F800000u | man << 13;
    else bits = sign | (exp + 112) << 23 | man << 13;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static float hsum8(const float v[8]) {
    const float s0 = v[0] + v[4], s1 = v[1] + v[5], s2 = v[2] + v[6], s3 = v[3] + v[7];
    return (s0 + s2) + (s1 + s3);
}

static void rows_block(const int qtype, const float *x, const float *xs, int64_t M, int64_t K, const uint8_t *w,
                       int64_t n0, int NB, float *y, int64_t N) {
    const int64_t G = K / 32, bs = qblock_bytes(qtype);
    for (int i = 0; i < NB; i++)
        for (int64_t m = 0; m < M; m++) {
            float a[8] = {0}, sc = 0.0f;
            for (int64_t g = 0; g < G; g++) {
                const uint8_t *b = w + ((n0 + i) * G + g) * bs;
                float c[32];
                if (qtype == Q8_0)
                    for (int j = 0; j < 32; j++) c[j] = (float)(int8_t)b[2 + j];
                else if (qtype == Q5_0) {
                    uint32_t qh;
                    memcpy(&qh, b + 2, 4);
                    for (int j = 0; j < 16; j++) {
                        c[j] = (float)((int)((b[6 + j] & 0x0F) | ((qh >> j) & 1) << 4) - 16);
                        c[j + 16] = (float)((int)((b[6 + j] >> 4) | ((qh >> (j + 16)) & 1) << 4) - 16);
                    }
                } else {
                    const uint8_t *qs = b + (qtype == Q4_1 ? 4 : 2);
                    for (int j = 0; j < 16; j++) { c[j] = (float)(qs[j] & 0x0F); c[j + 16] = (float)(qs[j] >> 4); }
                }
                const float *xr = x + m * K + g * 32, d = f16(b);
                for (int j = 0; j < 8; j++) {
                    float p = c[j] * xr[j];
                    p = __builtin_fmaf(c[8 + j], xr[8 + j], p);
                    p = __builtin_fmaf(c[16 + j], xr[16 + j], p);
                    p = __builtin_fmaf(c[24 + j], xr[24 + j], p);
                    a[j] = __builtin_fmaf(p, d, a[j]);
                }
                if (has_min(qtype)) sc = __builtin_fmaf(qtype == Q4_1 ? f16(b + 2) : -8.0f * d, xs[m * G + g], sc);
            }
            y[m * N + n0 + i] = hsum8(a) + sc;
        }
}

static void block_sums(const float *x, int64_t M, int64_t K, float *xs) {
    for (int64_t i = 0; i < M * (K / 32); i++) {
        const float *b = x + i * 32;
        float v[8];
        for (int j = 0; j < 8; j++) v[j] = (b[j] + b[8 + j]) + (b[16 + j] + b[24 + j]);
        xs[i] = hsum8(v);
    }
}
#endif

#if defined(HYSPEC_AVX2)
/* The same sums as rows_block for many rows of x (verification, prefill), output rows n0 .. n0+NB-1 (NB up to
 * MANY_OUTPUTS): rows of x in chunks of eight, each chunk passed over by every one of the NB output rows while it
 * sits in L1 (the NB rows' blocks stay in L1/L2 between chunks).  Every (output, row) pair goes through exactly
 * the operations rows_block does, in the same order: the results are equal. */
static inline __attribute__((always_inline)) void rows_block_many(const int qtype, const float *x, const float *xst,
                                                                  int64_t M, int64_t K, const uint8_t *w, int64_t n0,
                                                                  int NB, float *y, int64_t N) {
    const int64_t G = K / 32, bs = qblock_bytes(qtype);
    for (int64_t m0 = 0; m0 < M; m0 += ROW_CHUNK) {
        const int R = M - m0 < ROW_CHUNK ? (int)(M - m0) : ROW_CHUNK;
        const float *xc = x + m0 * K, *xstc = xst + m0 * G; /* xst: ROW_CHUNK lanes per block and chunk */
        for (int i = 0; i < NB; i++) {
            const uint8_t *wr = w + (n0 + i) * G * bs;
            float *yc = y + m0 * N + n0 + i;
            switch (R) {
                case 1: one_row_r(qtype, 1, xc, xstc, K, wr, yc, N); break;
                case 2: one_row_r(qtype, 2, xc, xstc, K, wr, yc, N); break;
                case 3: one_row_r(qtype, 3, xc, xstc, K, wr, yc, N); break;
                case 4: one_row_r(qtype, 4, xc, xstc, K, wr, yc, N); break;
                case 5: one_row_r(qtype, 5, xc, xstc, K, wr, yc, N); break;
                case 6: one_row_r(qtype, 6, xc, xstc, K, wr, yc, N); break;
                case 7: one_row_r(qtype, 7, xc, xstc, K, wr, yc, N); break;
                default: one_row_r(qtype, 8, xc, xstc, K, wr, yc, N); break;
            }
        }
    }
}
#endif

/* output rows n0 .. n0+NB-1 (NB <= 4, or up to MANY_OUTPUTS for rows_block_many): rows_block_many and rows_block
 * give equal results, the first is faster for many rows (it reads xs transposed, as transposed_block_sums writes) */
static inline __attribute__((always_inline)) void output_rows(const int qtype, int many, const float *x,
                                                              const float *xs, int64_t M, int64_t K, const uint8_t *w,
                                                              int64_t n0, int NB, float *y, int64_t N) {
#if defined(HYSPEC_AVX512)
    (void)many, (void)xs; /* one tile kernel for any number of rows; the weights carry m, no block sums */
    output_rows_avx512(qtype, x, M, K, w, n0, NB, y, N);
#elif defined(HYSPEC_AVX2)
    if (many) rows_block_many(qtype, x, xs, M, K, w, n0, NB, y, N);
    else rows_block(qtype, x, xs, M, K, w, n0, NB, y, N);
#else
    (void)many; /* the portable path computes row by row either way */
    rows_block(qtype, x, xs, M, K, w, n0, NB, y, N);
#endif
}

#include "kquants.c"

/* x [M, K] fp32, w [N, K / 32 blocks] (K-quants: K / 256 super-blocks), y [M, N] fp32; K a multiple of the
 * block.  Returns 0, -1 on bad arguments, -2 when out of memory. */
int hyspec_qgemm(int qtype, const float *x, int64_t M, int64_t K, const uint8_t *w, int64_t N, float *y) {
    if (qtype > Q5_0 && qtype <= LAST_QTYPE) return kq_gemm(qtype, x, M, K, w, N, y);
    if (qtype < 0 || qtype > Q5_0 || K % 32 || M < 0 || N < 0) return -1;
    const int many = M >= MANY_ROWS; /* verification, prefill: codes converted once per chunk of rows */
#if defined(HYSPEC_AVX512)
    if (M >= PANEL_ROWS) return qgemm_panel(qtype, x, M, K, w, N, y);
    float *xs = NULL; /* the AVX-512 path folds m into the dequantized weights */
#else
    float *xs = malloc(sizeof(float) * (size_t)(M * (K / 32) + 1));
    if (!xs) return -2;
    block_sums(x, M, K, xs);
#endif
    int64_t step = 4; /* output rows per task */
#if defined(HYSPEC_AVX2)
    if (many) {
        float *xst = malloc(sizeof(float) * (size_t)((M + ROW_CHUNK - 1) / ROW_CHUNK * ROW_CHUNK * (K / 32) + 1));
        if (!xst) {
            free(xs);
            return -2;
        }
        transposed_block_sums(xs, M, K / 32, xst);
        free(xs);
        xs = xst;
        /* a chunk of x read by up to MANY_OUTPUTS output rows, with at least four tasks per thread */
        const int64_t threads = omp_threads(), per = (N + 3) / 4 / (4 * threads);
        step = 4 * (per < 1 ? 1 : per > MANY_OUTPUTS / 4 ? MANY_OUTPUTS / 4 : per);
    }
#endif
    const int64_t ntasks = (N + step - 1) / step;
#pragma omp parallel for schedule(static)
    for (int64_t b = 0; b < ntasks; b++) {
        const int64_t n0 = b * step;
        const int NB = N - n0 >= step ? (int)step : (int)(N - n0);
        /* constant qtypes: each case is compiled for its own block format (no branch in the inner loop) */
        switch (qtype) {
            case Q4_0: output_rows(Q4_0, many, x, xs, M, K, w, n0, NB, y, N); break;
            case Q4_1: output_rows(Q4_1, many, x, xs, M, K, w, n0, NB, y, N); break;
            case Q5_0: output_rows(Q5_0, many, x, xs, M, K, w, n0, NB, y, N); break;
            default: output_rows(Q8_0, many, x, xs, M, K, w, n0, NB, y, N); break;
        }
    }
    free(xs);
    return 0;
}
