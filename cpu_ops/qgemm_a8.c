/*
 * y[m, n] = sum_k x[m, k] * w[n, k] with llama.cpp's 4/8-bit weights and 8-bit activations ("a8"):
 * integer dot products (AVX-512 VNNI's vpdpbusd, 64 multiply-adds an instruction) instead of fp32 FMAs.
 *
 * Why: the exact kernel (qgemm.c) is bound by its FMAs once several rows share the weights -- on a 2-core
 * Zen 4 VM every verified row of SmolLM2-135M cost ~1.2 ms on top of a 4.2 ms decode step, so speculation
 * needed long accepted runs to pay.  llama.cpp multiplies the same Q4 blocks by 8-bit activations; this
 * kernel does too, with every row quantized on its own, so a row's result still does not depend on its
 * batch and speculative verification reproduces plain decoding bit for bit -- but it is not the fp32
 * reference's arithmetic: the activations are rounded to 8 bits per 32-element block, as llama.cpp's are.
 *
 * Activations, one row at a time, per 32-element block b (the same scalar code on every ISA):
 *   dx_b = amax_b / 127,  q_i = lrintf(x_i * 127 / amax_b) in [-127, 127],  sx_b = dx_b * sum_i q_i
 * Weights, repacked once at load from the GGUF's blocks without changing a value: codes u as unsigned
 * bytes and w = d * u + m per block (Q4_1 / Q5_1: its own m; Q4_0: u = q, m = -8 d; Q8_0: u = q + 128, m = -128 d;
 * Q5_0: u = q, m = -16 d).  A Q4_K super-block is eight such blocks, each with d = d_super * scale and
 * m = -(dmin * min): the same arithmetic as llama.cpp's per-block scales, with 8-bit activations per 32 weights
 * where llama.cpp rounds them per 256; Q5_K likewise, with 5-bit codes.  A Q6_K super-block is eight blocks of
 * codes u = q (0..63) whose two halves of sixteen have their own d = d_super * scale (m = -32 d): the integer
 * sums and the sums of x are then taken per half (x's layout carries both halves' sums).  The products
 * d_super * scale are formed in the kernel, in fp32, where an fp16 times a 6- or 8-bit integer is exact.
 * Then per block
 *   sum_i w_i x_i ~= (d * dx_b) * sum_i u_i q_i + m * sx_b      (the integer sum exact in int32)
 *
 * Layout (per output row, contiguous): blocks in groups of 16, "one lane per block": vpdpbusd j (0..7) of a
 * group multiplies, in lane l, block l's codes 4j..4j+3 by the row's, so each lane sums one block and no
 * horizontal sum is needed per block.  Codes are stored as their low nibbles, two to a byte: chunk c (0..3)
 * holds, lane l, byte i, codes 4c+i (low nibble) and 16+4c+i (high nibble), so one load and a shift feed two
 * vpdpbusd (Q8_0 keeps a code a byte).  The 5-bit types follow with one plane of their fifth bits (byte l*4+i,
 * bit j: code 4j+i's), Q6_K with two planes of its two high bits (plane j/4, bits 2(j%4)..), merged into the
 * nibbles with a shift and a ternary op.  Then the group's scales: 16 fp16 d (Q4_1 / Q5_1: and 16 fp16 m);
 * Q4_K / Q5_K: the 16 blocks' 6-bit scales and mins a byte each, then both super-blocks' fp16 d and dmin;
 * Q6_K: the int8 scales of the 16 blocks' first halves, of their second halves, then both fp16 d.
 * Blocks left after the groups go in pairs, two blocks to a vector (lanes 0-7 block A's 32 codes, 8-15 block
 * B's; an odd last block is paired with zeros), codes a byte each above 4 bits and the K-quants' d and m as
 * fp32 products.  A group reads the GGUF's own bytes for Q4_0, Q4_1, Q8_0, Q5_0, Q5_1 and Q6_K (18, 20, 34, 22,
 * 24 and 26.25 per 32 weights), Q4_K 18.5 (against 18) and Q5_K 22.5 (against 22).
 *
 * Sums, per (output row, row of x): sixteen fp32 lanes, per group or pair in order
 *   acc = fma(d * dx, (float)isum, acc);  acc = fma(m, sx, acc)
 * then the lanes added in a fixed tree (hsum16).  The portable path does exactly these operations lane by
 * lane with fmaf, so every ISA gives the same bits (tests/test_cpu_ops_qgemm_a8.py).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__) && defined(__F16C__)
#include <immintrin.h>
#define HYSPEC_A8_VNNI 1
#include "hsum16.h"
#endif

/* the block types a8 takes, numbered as hyspec_qgemm numbers them (qgemm.py's QTYPES) */
enum { A8_Q4_0 = 0, A8_Q4_1 = 1, A8_Q8_0 = 2, A8_Q5_0 = 3, A8_Q5_1 = 4, A8_Q4_K = 5, A8_Q5_K = 6, A8_Q6_K = 7 };
/* Prefetched into L2, not L1: 16 KiB ahead of four weight streams would evict the L1 lines in use, and a step's
 * matrices streamed at ~21 GB/s into L1 against ~31 into L2 (docs/results/2026-12-07/a8-compact-layout/) */
enum { A8_PREFETCH_BYTES = 8192 };

int hyspec_qgemm_a8_version(void) { return 3; }

#if defined(HYSPEC_A8_VNNI)
const char *hyspec_qgemm_a8_isa(void) { return "avx512-vnni"; }
#else
const char *hyspec_qgemm_a8_isa(void) { return "portable"; }
#endif

static inline int a8_supported(int qtype) {
    return qtype >= A8_Q4_0 && qtype <= A8_Q6_K;
}
static inline int a8_super(int qtype) { return qtype >= A8_Q4_K && qtype <= A8_Q6_K; } /* 256-weight blocks */
/* the K-quants whose blocks of 32 carry their own scale and min */
static inline int a8_k_min(int qtype) { return qtype == A8_Q4_K || qtype == A8_Q5_K; }
/* the 32-weight types whose blocks store an fp16 m */
static inline int a8_f16_min(int qtype) { return qtype == A8_Q4_1 || qtype == A8_Q5_1; }
/* bytes of one GGUF block: 32 weights, or Q4_K's super-block of 256 (eight blocks of 32 in the a8 layout) */
static inline int a8_block_bytes(int qtype) {
    return qtype == A8_Q4_0   ? 18
           : qtype == A8_Q4_1 ? 20
           : qtype == A8_Q5_0 ? 22
           : qtype == A8_Q5_1 ? 24
           : qtype == A8_Q4_K ? 144
           : qtype == A8_Q5_K ? 176
           : qtype == A8_Q6_K ? 210
                              : 34;
}

static inline float a8_f16(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    /* IEEE half to float, exactly (no F16C needed: the packer runs once) */
    const uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    uint32_t bits;
    if (exp == 0) {
        if (man == 0) bits = sign;
        else { /* subnormal */
            float f = ldexpf((float)man, -24);
            memcpy(&bits, &f, 4);
            bits |= sign;
        }
    } else if (exp == 31) bits = sign | 0x7f800000u | (man << 13);
    else bits = sign | ((exp + 112) << 23) | (man << 13);
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static inline float a8_f32(const uint8_t *p) {
    float f;
    memcpy(&f, p, 4);
    return f;
}

static inline int64_t a8_groups(int64_t K) { return K / 32 / 16; }
static inline int64_t a8_pairs(int64_t K) { return (K / 32 % 16 + 1) / 2; }
/* bits of a code above its low nibble: Q5_0 / Q5_1 / Q5_K one, Q6_K two (Q8_0's codes are whole bytes) */
static inline int a8_high_bits(int qtype) {
    return qtype == A8_Q6_K ? 2 : qtype == A8_Q5_0 || qtype == A8_Q5_1 || qtype == A8_Q5_K ? 1 : 0;
}
/* a group's codes: Q8_0 a byte each; the others as nibbles, then a plane of their high bits */
static inline int a8_group_code_bytes(int qtype) { return qtype == A8_Q8_0 ? 512 : 256 + 64 * a8_high_bits(qtype); }
/* a group's scales: 16 fp16 d (Q4_1 / Q5_1: and 16 fp16 m); Q4_K / Q5_K: 16 6-bit scales, 16 6-bit mins (a byte
 * each), then the two super-blocks' fp16 d and dmin; Q6_K: 16 int8 scales of the blocks' first halves, 16 of their
 * second halves, then the two super-blocks' fp16 d */
static inline int a8_group_scale_bytes(int qtype) {
    return a8_k_min(qtype) ? 40 : qtype == A8_Q6_K ? 36 : a8_f16_min(qtype) ? 64 : 32;
}
static inline int a8_group_bytes(int qtype) { return a8_group_code_bytes(qtype) + a8_group_scale_bytes(qtype); }
/* a pair (the blocks after the groups) keeps a code a byte for every type with more than four bits */
static inline int a8_pair_byte_codes(int qtype) { return qtype == A8_Q8_0 || a8_high_bits(qtype); }
static inline int a8_pair_code_bytes(int qtype) { return a8_pair_byte_codes(qtype) ? 32 : 16; } /* a block's */
/* per block of a pair: fp16 d (Q4_1 / Q5_1: and m); the K-quants fp32 d and m, exact products of their scales */
static inline int a8_pair_scale_bytes(int qtype) { return a8_super(qtype) ? 8 : a8_f16_min(qtype) ? 4 : 2; }
static inline int a8_pair_bytes(int qtype) { return 2 * (a8_pair_code_bytes(qtype) + a8_pair_scale_bytes(qtype)); }
/* m = a8_min_factor * d where m is not stored (Q4_0: codes 0..15 for q - 8; Q8_0: q + 128; Q5_0: q - 16) */
static inline float a8_min_factor(int qtype) {
    return qtype == A8_Q4_0 ? -8.0f : qtype == A8_Q5_0 ? -16.0f : qtype == A8_Q6_K ? -32.0f : -128.0f;
}

/* bytes of one output row in the a8 layout */
int64_t hyspec_qgemm_a8_row_bytes(int qtype, int64_t K) {
    if (!a8_supported(qtype) || K % 32 || (a8_super(qtype) && K % 256)) return -1;
    return a8_groups(K) * a8_group_bytes(qtype) + a8_pairs(K) * a8_pair_bytes(qtype);
}

/* Q4_K's 6-bit scale and min of block j (0..7) of a super-block, from its 12 packed bytes (llama.cpp's
 * get_scale_min_k4) */
static inline void a8_q4_k_scale_min(const uint8_t *sc, int j, int *scale, int *min) {
    if (j < 4) *scale = sc[j] & 63, *min = sc[j + 4] & 63;
    else *scale = (sc[j + 4] & 0x0f) | (sc[j - 4] >> 6) << 4, *min = (sc[j + 4] >> 4) | (sc[j] >> 6) << 4;
}

/* code u (unsigned) of element i of block b (32 weights) of a GGUF row: w = d * u + m */
static inline int a8_code(int qtype, const uint8_t *row, int64_t b, int i) {
    if (qtype == A8_Q4_K) { /* block 2p / 2p + 1 of a super-block: low / high nibbles of its bytes 16 + 32 p .. */
        const uint8_t byte = row[b / 8 * 144 + 16 + 32 * (b % 8 / 2) + i];
        return b % 2 ? byte >> 4 : byte & 0x0f;
    }
    if (qtype == A8_Q5_K) { /* as Q4_K, with bit j of byte i of qh (bytes 16..47) as the fifth bit */
        const uint8_t *sb = row + b / 8 * 176;
        const int j = (int)(b % 8), byte = sb[48 + 32 * (j / 2) + i];
        return (j % 2 ? byte >> 4 : byte & 0x0f) | (sb[16 + i] >> j & 1) << 4;
    }
    if (qtype == A8_Q6_K) { /* block j of a super-block: elements 32 j + i, llama.cpp's dequantize_row_q6_K order */
        const uint8_t *sb = row + b / 8 * 210;
        const int j = (int)(b % 8), h = j / 4, quarter = j % 4;
        const int low = sb[h * 64 + i + (quarter & 1) * 32] >> (quarter >= 2 ? 4 : 0) & 0x0f;
        return low | (sb[128 + h * 32 + i] >> (2 * quarter) & 3) << 4; /* q, w = d * scale * (q - 32) */
    }
    const uint8_t *blk = row + b * a8_block_bytes(qtype);
    if (qtype == A8_Q8_0) return (int)(int8_t)blk[2 + i] + 128;
    if (qtype == A8_Q5_0 || qtype == A8_Q5_1) { /* the nibble, and bit i of qh as its fifth bit (Q5_1: after m) */
        const int at = qtype == A8_Q5_1 ? 4 : 2;
        uint32_t qh;
        memcpy(&qh, blk + at, 4);
        return (i < 16 ? blk[at + 4 + i] & 0x0f : blk[at + 4 + i - 16] >> 4) | (int)((qh >> i) & 1) << 4;
    }
    const uint8_t *qs = blk + (qtype == A8_Q4_1 ? 4 : 2);
    return i < 16 ? qs[i] & 0x0f : qs[i - 16] >> 4;
}

/* block b's d (and m where stored) written to d_out / m_out: the GGUF's fp16 bits, or for Q4_K the exact fp32
 * products d * scale and -(dmin * min) (an fp16 times a 6-bit integer fits fp32's mantissa) */
static inline void a8_scales(int qtype, const uint8_t *row, int64_t b, uint8_t *d_out, uint8_t *m_out) {
    if (qtype == A8_Q6_K) { /* no m: d of the block's first sixteen weights, then of its last sixteen (m = -32 d) */
        const uint8_t *sb = row + b / 8 * 210;
        const int j = (int)(b % 8), first = (j / 4) * 8 + (j % 4) * 2;
        const float d = a8_f16(sb + 208), lo = d * (float)(int8_t)sb[192 + first], hi = d * (float)(int8_t)sb[193 + first];
        memcpy(d_out, &lo, 4), memcpy(m_out, &hi, 4);
        return;
    }
    if (a8_k_min(qtype)) { /* Q4_K / Q5_K: d, dmin, then the same 12 bytes of packed scales and mins */
        const uint8_t *s = row + b / 8 * a8_block_bytes(qtype);
        int scale, min;
        a8_q4_k_scale_min(s + 4, (int)(b % 8), &scale, &min);
        const float d = a8_f16(s) * (float)scale, m = -(a8_f16(s + 2) * (float)min);
        memcpy(d_out, &d, 4), memcpy(m_out, &m, 4);
        return;
    }
    const uint8_t *blk = row + b * a8_block_bytes(qtype);
    memcpy(d_out, blk, 2);
    if (a8_f16_min(qtype)) memcpy(m_out, blk + 2, 2);
}

/* the scales of group blocks b0 .. b0 + 15 of a K-quant row, as a8_group_scale_bytes lays them out: the GGUF's
 * 6-bit (Q6_K: int8) block scales a byte each and its super-blocks' fp16 d (and dmin) as their bits; the kernel
 * forms the same exact fp32 products a8_scales does */
static void a8_group_k_scales(int qtype, const uint8_t *row, int64_t b0, uint8_t *o) {
    for (int l = 0; l < 16; l++) {
        const int64_t b = b0 + l;
        const uint8_t *sb = row + b / 8 * a8_block_bytes(qtype);
        const int j = (int)(b % 8);
        if (qtype == A8_Q6_K) {
            const int first = (j / 4) * 8 + (j % 4) * 2;
            o[l] = sb[192 + first], o[16 + l] = sb[193 + first];
        } else {
            int scale, min;
            a8_q4_k_scale_min(sb + 4, j, &scale, &min);
            o[l] = (uint8_t)scale, o[16 + l] = (uint8_t)min;
        }
    }
    for (int h = 0; h < 2; h++) { /* lanes 0-7 are super-block b0 / 8, lanes 8-15 the next */
        const uint8_t *sb = row + (b0 / 8 + h) * a8_block_bytes(qtype);
        if (qtype == A8_Q6_K) memcpy(o + 32 + 2 * h, sb + 208, 2);
        else memcpy(o + 32 + 2 * h, sb, 2), memcpy(o + 36 + 2 * h, sb + 2, 2);
    }
}

/* Repack N rows of GGUF blocks [N, K * bs / 32 (Q4_K: / 256)] into the a8 layout [N, row_bytes].  Every fp16 d
 * and m is copied as its bits (the K-quants' pair blocks: the products of a8_scales).  Returns 0, -1 on bad
 * arguments. */
int hyspec_qgemm_a8_pack(int qtype, const uint8_t *w, int64_t N, int64_t K, uint8_t *out) {
    const int64_t rb = hyspec_qgemm_a8_row_bytes(qtype, K);
    if (rb < 0 || N < 0) return -1;
    const int cb = a8_pair_code_bytes(qtype), sb = a8_pair_scale_bytes(qtype), dw = a8_super(qtype) ? 4 : 2;
    const int hb = a8_high_bits(qtype);
    const int64_t nb = K / 32, G = a8_groups(K), P = a8_pairs(K), row_in = K / 32 * a8_block_bytes(qtype);
    for (int64_t n = 0; n < N; n++) {
        const uint8_t *row = w + n * (a8_super(qtype) ? K / 256 * a8_block_bytes(qtype) : row_in);
        uint8_t *o = out + n * rb;
        for (int64_t g = 0; g < G; g++) {
            const int64_t b0 = g * 16;
            memset(o, 0, (size_t)a8_group_bytes(qtype));
            for (int j = 0; j < 8; j++) /* code 4j + i of lane l */
                for (int l = 0; l < 16; l++)
                    for (int i = 0; i < 4; i++) {
                        const int u = a8_code(qtype, row, b0 + l, 4 * j + i);
                        if (qtype == A8_Q8_0) {
                            o[j * 64 + l * 4 + i] = (uint8_t)u;
                            continue;
                        }
                        o[(j & 3) * 64 + l * 4 + i] |= (uint8_t)((u & 0x0f) << (j < 4 ? 0 : 4));
                        if (hb == 1) o[256 + l * 4 + i] |= (uint8_t)((u >> 4 & 1) << j);
                        if (hb == 2) o[256 + (j / 4) * 64 + l * 4 + i] |= (uint8_t)((u >> 4 & 3) << 2 * (j % 4));
                    }
            o += a8_group_code_bytes(qtype);
            if (a8_super(qtype)) a8_group_k_scales(qtype, row, b0, o);
            else
                for (int l = 0; l < 16; l++) a8_scales(qtype, row, b0 + l, o + 2 * l, o + 32 + 2 * l); /* d's, m's */
            o += a8_group_scale_bytes(qtype);
        }
        for (int64_t p = 0; p < P; p++) {
            const int64_t a = G * 16 + 2 * p, has_b = a + 1 < nb;
            /* a missing B is zero codes with d = m = 0 (its x is zeros too) */
            if (a8_pair_byte_codes(qtype)) {
                for (int i = 0; i < 32; i++) o[i] = (uint8_t)a8_code(qtype, row, a, i);
                for (int i = 0; i < 32; i++) o[32 + i] = has_b ? (uint8_t)a8_code(qtype, row, a + 1, i) : 0;
            } else
                for (int i = 0; i < 32; i++)
                    o[i] = (uint8_t)(a8_code(qtype, row, a, i) | (has_b ? a8_code(qtype, row, a + 1, i) : 0) << 4);
            o += 2 * cb;
            memset(o, 0, (size_t)(2 * sb));
            a8_scales(qtype, row, a, o, o + 2 * dw); /* dA dB, then mA mB */
            if (has_b) a8_scales(qtype, row, a + 1, o + dw, o + 3 * dw);
            o += 2 * sb;
        }
    }
    return 0;
}

/* One row of x quantized, in the layout the kernels read (64-byte aligned pieces):
 *   per group: 8 chunks x 64 int8 (chunk j, lane l, byte i = block l's code 4j+i), dx[16], sx[16] fp32, then
 *              sx of each block's first and last sixteen codes alone (Q6_K, whose scales cover sixteen weights)
 *   per pair:  64 int8 (block A's 32 codes, B's 32), dx[16] (A in lanes 0-7, B in 8-15), sx[16] (A's in
 *              lane 0, B's in lane 8, zeros elsewhere: the m term of a pair is added once per block), and the
 *              half-block sums (A's halves in lanes 0 and 4, B's in 8 and 12, zeros elsewhere) */
enum { A8_XGROUP = 512 + 4 * 64, A8_XPAIR = 64 + 3 * 64 };
static inline int64_t a8_xrow_bytes(int64_t K) { return a8_groups(K) * A8_XGROUP + a8_pairs(K) * A8_XPAIR; }

#if defined(HYSPEC_A8_VNNI)
/* the scalar version's exact results, sixteen lanes at a time: the maximum and the integer sum are exact,
 * d and 1/d the same scalar divisions, and cvtps rounds to nearest-even as lrintf does by default */
static void a8_quantize_block(const float *x, int8_t q[32], float *dx, float *sx, float *sxl, float *sxh) {
    const __m512 x0 = _mm512_loadu_ps(x), x1 = _mm512_loadu_ps(x + 16);
    const __m512 a = _mm512_max_ps(_mm512_abs_ps(x0), _mm512_abs_ps(x1));
    const __mmask16 bad = _mm512_cmp_ps_mask(a, _mm512_set1_ps(3.4028235e38f), _CMP_NLE_UQ); /* inf or NaN */
    if (bad) {
        memset(q, 0, 32);
        *dx = *sx = *sxl = *sxh = NAN;
        return;
    }
    const float amax = _mm512_reduce_max_ps(a);
    const float d = amax / 127.0f, id = amax > 0.0f ? 127.0f / amax : 0.0f;
    const __m512 vid = _mm512_set1_ps(id);
    const __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(x0, vid)), q1 = _mm512_cvtps_epi32(_mm512_mul_ps(x1, vid));
    _mm_storeu_si128((__m128i *)q, _mm512_cvtsepi32_epi8(q0));
    _mm_storeu_si128((__m128i *)(q + 16), _mm512_cvtsepi32_epi8(q1));
    /* the halves' integer sums, and the block's as their exact sum: two reductions, not three */
    const int low = _mm512_reduce_add_epi32(q0), high = _mm512_reduce_add_epi32(q1);
    *dx = d, *sx = d * (float)(low + high), *sxl = d * (float)low, *sxh = d * (float)high;
}
#else
static void a8_quantize_block(const float *x, int8_t q[32], float *dx, float *sx, float *sxl, float *sxh) {
    float amax = 0.0f;
    int finite = 1;
    for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(x[i])), finite &= isfinite(x[i]) != 0;
    int sum = 0, low = 0;
    if (!finite) { /* inf or NaN among the inputs: the block's result is NaN, as the fp32 sum's would be */
        memset(q, 0, 32);
        *dx = *sx = *sxl = *sxh = NAN;
        return;
    }
    const float d = amax / 127.0f, id = amax > 0.0f ? 127.0f / amax : 0.0f;
    for (int i = 0; i < 32; i++) {
        long v = lrintf(x[i] * id); /* |x * id| <= 127 up to rounding */
        v = v > 127 ? 127 : v < -127 ? -127 : v;
        q[i] = (int8_t)v, sum += (int)v, low += i < 16 ? (int)v : 0;
    }
    *dx = d, *sx = d * (float)sum, *sxl = d * (float)low, *sxh = d * (float)(sum - low);
}
#endif

static void a8_quantize_row(const float *x, int64_t K, uint8_t *out) {
    const int64_t nb = K / 32, G = a8_groups(K), P = a8_pairs(K);
    int8_t q[16][32];
    for (int64_t g = 0; g < G; g++) {
        float *dx = (float *)(out + 512), *sx = (float *)(out + 576), *sxl = sx + 16, *sxh = sx + 32;
        for (int l = 0; l < 16; l++)
            a8_quantize_block(x + (g * 16 + l) * 32, q[l], dx + l, sx + l, sxl + l, sxh + l);
        for (int j = 0; j < 8; j++)
            for (int l = 0; l < 16; l++) memcpy(out + j * 64 + l * 4, &q[l][4 * j], 4);
        out += A8_XGROUP;
    }
    for (int64_t p = 0; p < P; p++) {
        const int64_t a = G * 16 + 2 * p;
        float dA, sA, lA, hA, dB = 0.0f, sB = 0.0f, lB = 0.0f, hB = 0.0f;
        a8_quantize_block(x + a * 32, q[0], &dA, &sA, &lA, &hA);
        if (a + 1 < nb) a8_quantize_block(x + (a + 1) * 32, q[1], &dB, &sB, &lB, &hB);
        else memset(q[1], 0, 32);
        memcpy(out, q[0], 32), memcpy(out + 32, q[1], 32);
        float *dx = (float *)(out + 64), *sx = (float *)(out + 128), *sxq = (float *)(out + 192);
        for (int l = 0; l < 16; l++) dx[l] = l < 8 ? dA : dB, sx[l] = sxq[l] = 0.0f;
        sx[0] = sA, sx[8] = sB;
        sxq[0] = lA, sxq[4] = hA, sxq[8] = lB, sxq[12] = hB;
        out += A8_XPAIR;
    }
}

static inline float a8_hsum16(const float v[16]) { /* hsum16.h's order, lane by lane */
    float h[8], s[4];
    for (int i = 0; i < 8; i++) h[i] = v[i] + v[i + 8];
    for (int i = 0; i < 4; i++) s[i] = h[i] + h[i + 4];
    const float t0 = s[0] + s[2], t1 = s[1] + s[3];
    return t0 + t1;
}

#if defined(HYSPEC_A8_VNNI)

/* NB output rows (records of rb bytes from w) against R quantized rows of x (records of xb bytes), both
 * compile-time.  Per group, an output row's codes are loaded and unpacked once into eight registers for all
 * R rows; each row then runs its eight vpdpbusd (x read from L1 as memory operands, two independent chains)
 * and folds the group into its fp32 accumulator, so only the NB * R accumulators stay live. */
static inline __attribute__((always_inline)) void a8_tile(const int qtype, const int NB, const int R,
                                                          const uint8_t *xq, int64_t xb, int64_t K,
                                                          const uint8_t *w, int64_t rb, float *y, int64_t N) {
    const int64_t G = a8_groups(K), P = a8_pairs(K);
    const int cb = a8_pair_code_bytes(qtype), gb = a8_group_bytes(qtype);
    const int pb = a8_pair_bytes(qtype), gc = a8_group_code_bytes(qtype), hb = a8_high_bits(qtype);
    const int ahead = R == 1 ? 2 * A8_PREFETCH_BYTES : A8_PREFETCH_BYTES;
    const __m512i nib = _mm512_set1_epi8(0x0f), bit4 = _mm512_set1_epi8(0x10), bits45 = _mm512_set1_epi8(0x30);
    const __m512i halves = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    const __m512i halves_hi = _mm512_add_epi32(halves, _mm512_set1_epi32(2));
    const __m512 sign = _mm512_set1_ps(-0.0f);
    const float mk = a8_min_factor(qtype); /* m = mk * d where m is not stored */
    __m512 acc[4][8];
    for (int n = 0; n < NB; n++)
        for (int r = 0; r < R; r++) acc[n][r] = _mm512_setzero_ps();
    for (int64_t g = 0; g < G; g++) {
        const int64_t wo = g * gb, xo = g * A8_XGROUP;
        /* the NB records are one contiguous region: one sweep `ahead` bytes past the tile's progress */
        for (int64_t off = 0; off < NB * gb; off += 64)
            _mm_prefetch((const char *)(w + g * NB * gb + off + ahead), _MM_HINT_T1);
        for (int n = 0; n < NB; n++) {
            __m512i u[8];
            const uint8_t *wn = w + n * rb + wo;
            if (qtype == A8_Q8_0)
                for (int j = 0; j < 8; j++) u[j] = _mm512_loadu_si512((const void *)(wn + j * 64));
            else
                for (int c = 0; c < 4; c++) {
                    const __m512i v = _mm512_loadu_si512((const void *)(wn + c * 64));
                    u[c] = _mm512_and_si512(v, nib);
                    u[c + 4] = _mm512_and_si512(_mm512_srli_epi16(v, 4), nib);
                }
            /* the high bits, moved to bit 4 (and 5) of each code's byte: u | (shifted & mask) in one ternary op.
             * The 16-bit shifts carry bits across bytes only below bit 4 or above bit 5, where the mask drops them. */
            if (hb == 1) {
                const __m512i h = _mm512_loadu_si512((const void *)(wn + 256));
                u[0] = _mm512_ternarylogic_epi32(u[0], _mm512_slli_epi16(h, 4), bit4, 0xf8);
                u[1] = _mm512_ternarylogic_epi32(u[1], _mm512_slli_epi16(h, 3), bit4, 0xf8);
                u[2] = _mm512_ternarylogic_epi32(u[2], _mm512_slli_epi16(h, 2), bit4, 0xf8);
                u[3] = _mm512_ternarylogic_epi32(u[3], _mm512_slli_epi16(h, 1), bit4, 0xf8);
                u[4] = _mm512_ternarylogic_epi32(u[4], h, bit4, 0xf8);
                u[5] = _mm512_ternarylogic_epi32(u[5], _mm512_srli_epi16(h, 1), bit4, 0xf8);
                u[6] = _mm512_ternarylogic_epi32(u[6], _mm512_srli_epi16(h, 2), bit4, 0xf8);
                u[7] = _mm512_ternarylogic_epi32(u[7], _mm512_srli_epi16(h, 3), bit4, 0xf8);
            } else if (hb == 2)
                for (int q = 0; q < 2; q++) {
                    const __m512i h = _mm512_loadu_si512((const void *)(wn + 256 + 64 * q));
                    u[4 * q] = _mm512_ternarylogic_epi32(u[4 * q], _mm512_slli_epi16(h, 4), bits45, 0xf8);
                    u[4 * q + 1] = _mm512_ternarylogic_epi32(u[4 * q + 1], _mm512_slli_epi16(h, 2), bits45, 0xf8);
                    u[4 * q + 2] = _mm512_ternarylogic_epi32(u[4 * q + 2], h, bits45, 0xf8);
                    u[4 * q + 3] = _mm512_ternarylogic_epi32(u[4 * q + 3], _mm512_srli_epi16(h, 2), bits45, 0xf8);
                }
            const uint8_t *s = wn + gc;
            __m512 d, m;
            if (a8_super(qtype)) { /* the exact products of a8_scales: fp16 d times a small integer */
                const __m512 sup = _mm512_castps128_ps512(_mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)(s + 32))));
                const __m128i lo8 = _mm_loadu_si128((const __m128i *)s);
                const __m128i hi8 = _mm_loadu_si128((const __m128i *)(s + 16));
                /* Q6_K's scales are signed bytes, Q4_K's / Q5_K's unsigned */
                const __m512i lo32 = qtype == A8_Q6_K ? _mm512_cvtepi8_epi32(lo8) : _mm512_cvtepu8_epi32(lo8);
                const __m512i hi32 = qtype == A8_Q6_K ? _mm512_cvtepi8_epi32(hi8) : _mm512_cvtepu8_epi32(hi8);
                const __m512 lo = _mm512_cvtepi32_ps(lo32), hi = _mm512_cvtepi32_ps(hi32);
                const __m512 d_super = _mm512_permutexvar_ps(halves, sup); /* lanes 0-7 super-block A's, 8-15 B's */
                d = _mm512_mul_ps(d_super, lo);
                /* Q6_K: in m's place the d of each block's last sixteen weights; Q4_K / Q5_K: m = -(dmin * min) */
                m = qtype == A8_Q6_K ? _mm512_mul_ps(d_super, hi)
                                     : _mm512_xor_ps(_mm512_mul_ps(_mm512_permutexvar_ps(halves_hi, sup), hi), sign);
            } else {
                d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)s));
                m = a8_f16_min(qtype) ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(s + 32)))
                                      : _mm512_mul_ps(d, _mm512_set1_ps(mk));
            }
            for (int r = 0; r < R; r++) {
                const uint8_t *xr = xq + r * xb + xo;
                __m512i s0 = _mm512_setzero_si512(), s1 = _mm512_setzero_si512();
                for (int j = 0; j < 4; j++) {
                    s0 = _mm512_dpbusd_epi32(s0, u[j], _mm512_load_si512((const void *)(xr + j * 64)));
                    s1 = _mm512_dpbusd_epi32(s1, u[j + 4], _mm512_load_si512((const void *)(xr + (j + 4) * 64)));
                }
                const __m512 dx = _mm512_load_ps((const float *)(xr + 512));
                if (qtype == A8_Q6_K) { /* each half by its own scale: d (q - 32) summed as d q - 32 d sx */
                    const __m512 sxl = _mm512_load_ps((const float *)(xr + 640)), sxh = _mm512_load_ps((const float *)(xr + 704));
                    acc[n][r] = _mm512_fmadd_ps(_mm512_mul_ps(d, dx), _mm512_cvtepi32_ps(s0), acc[n][r]);
                    acc[n][r] = _mm512_fmadd_ps(_mm512_mul_ps(m, dx), _mm512_cvtepi32_ps(s1), acc[n][r]);
                    acc[n][r] = _mm512_fmadd_ps(_mm512_mul_ps(d, _mm512_set1_ps(mk)), sxl, acc[n][r]);
                    acc[n][r] = _mm512_fmadd_ps(_mm512_mul_ps(m, _mm512_set1_ps(mk)), sxh, acc[n][r]);
                    continue;
                }
                const __m512 sx = _mm512_load_ps((const float *)(xr + 576));
                acc[n][r] = _mm512_fmadd_ps(_mm512_mul_ps(d, dx), _mm512_cvtepi32_ps(_mm512_add_epi32(s0, s1)), acc[n][r]);
                acc[n][r] = _mm512_fmadd_ps(m, sx, acc[n][r]);
            }
        }
    }
    for (int64_t p = 0; p < P; p++) {
        const int64_t wo = G * gb + p * pb, xo = G * A8_XGROUP + p * A8_XPAIR;
        for (int64_t off = 0; off < NB * pb; off += 64)
            _mm_prefetch((const char *)(w + G * NB * gb + p * NB * pb + off + ahead), _MM_HINT_T1);
        for (int n = 0; n < NB; n++) {
            const uint8_t *wn = w + n * rb + wo;
            __m512i u;
            if (a8_pair_byte_codes(qtype)) u = _mm512_loadu_si512((const void *)wn);
            else {
                const __m256i v = _mm256_loadu_si256((const __m256i *)wn), n4 = _mm256_set1_epi8(0x0f);
                u = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_and_si256(v, n4)),
                                       _mm256_and_si256(_mm256_srli_epi16(v, 4), n4), 1);
            }
            __m512 d, m;
            if (qtype == A8_Q6_K) { /* dA_lo dB_lo dA_hi dB_hi: lanes 0-3 A's first half, 4-7 its second, 8-15 B's */
                const __m512i quarters = _mm512_setr_epi32(0, 0, 0, 0, 2, 2, 2, 2, 1, 1, 1, 1, 3, 3, 3, 3);
                d = _mm512_permutexvar_ps(quarters, _mm512_castps128_ps512(_mm_loadu_ps((const float *)(wn + 2 * cb))));
                m = _mm512_mul_ps(d, _mm512_set1_ps(mk));
            } else if (a8_k_min(qtype)) { /* dA dB, mA mB as fp32: each to its half of the lanes */
                d = _mm512_permutexvar_ps(halves, _mm512_castps128_ps512(_mm_castsi128_ps(_mm_loadl_epi64((const __m128i *)(wn + 2 * cb)))));
                m = _mm512_permutexvar_ps(halves, _mm512_castps128_ps512(_mm_castsi128_ps(_mm_loadl_epi64((const __m128i *)(wn + 2 * cb + 8)))));
            } else {
                uint32_t dbits, mbits = 0;
                memcpy(&dbits, wn + 2 * cb, 4);
                if (a8_f16_min(qtype)) memcpy(&mbits, wn + 2 * cb + 4, 4);
                d = _mm512_permutexvar_ps(halves, _mm512_castps128_ps512(_mm_cvtph_ps(_mm_cvtsi32_si128((int)dbits))));
                m = a8_f16_min(qtype)
                        ? _mm512_permutexvar_ps(halves, _mm512_castps128_ps512(_mm_cvtph_ps(_mm_cvtsi32_si128((int)mbits))))
                        : _mm512_mul_ps(d, _mm512_set1_ps(mk));
            }
            for (int r = 0; r < R; r++) {
                const uint8_t *xr = xq + r * xb + xo;
                const __m512i is = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u, _mm512_load_si512((const void *)xr));
                const __m512 dx = _mm512_load_ps((const float *)(xr + 64));
                /* Q6_K: its m term per half block, so the half-block sums */
                const __m512 sx = _mm512_load_ps((const float *)(xr + (qtype == A8_Q6_K ? 192 : 128)));
                acc[n][r] = _mm512_fmadd_ps(_mm512_mul_ps(d, dx), _mm512_cvtepi32_ps(is), acc[n][r]);
                acc[n][r] = _mm512_fmadd_ps(m, sx, acc[n][r]);
            }
        }
    }
    for (int n = 0; n < NB; n++)
        for (int r = 0; r < R; r++) y[r * N + n] = hsum16(acc[n][r]);
}

/* output rows n0 .. n0+NB-1 against every row of x: one row of x in 4 x 1 tiles (four weight streams in
 * flight), more in 1 x R tiles of up to eight rows (each output row's codes unpacked once for all R; a
 * larger tile ran out of registers and spilled its accumulators) */
static inline __attribute__((always_inline)) void a8_output_rows(const int qtype, const uint8_t *xq, int64_t xb,
                                                                 int64_t M, int64_t K, const uint8_t *w, int64_t rb,
                                                                 int64_t n0, int NB, float *y, int64_t N) {
    const uint8_t *wb = w + n0 * rb;
    if (M == 1) {
        if (NB == 4) a8_tile(qtype, 4, 1, xq, xb, K, wb, rb, y + n0, N);
        else
            for (int i = 0; i < NB; i++) a8_tile(qtype, 1, 1, xq, xb, K, wb + i * rb, rb, y + n0 + i, N);
        return;
    }
    for (int64_t m0 = 0; m0 < M; m0 += 8) {
        const int R = M - m0 < 8 ? (int)(M - m0) : 8;
        const uint8_t *xc = xq + m0 * xb;
        for (int i = 0; i < NB; i++) {
            float *yc = y + m0 * N + n0 + i;
            const uint8_t *wi = wb + i * rb;
            switch (R) {
                case 1: a8_tile(qtype, 1, 1, xc, xb, K, wi, rb, yc, N); break;
                case 2: a8_tile(qtype, 1, 2, xc, xb, K, wi, rb, yc, N); break;
                case 3: a8_tile(qtype, 1, 3, xc, xb, K, wi, rb, yc, N); break;
                case 4: a8_tile(qtype, 1, 4, xc, xb, K, wi, rb, yc, N); break;
                case 5: a8_tile(qtype, 1, 5, xc, xb, K, wi, rb, yc, N); break;
                case 6: a8_tile(qtype, 1, 6, xc, xb, K, wi, rb, yc, N); break;
                case 7: a8_tile(qtype, 1, 7, xc, xb, K, wi, rb, yc, N); break;
                default: a8_tile(qtype, 1, 8, xc, xb, K, wi, rb, yc, N); break;
            }
        }
    }
}

#else /* portable: the same lane operations, one lane at a time */

/* code 4j + i of lane l of a group, as the VNNI path unpacks it */
static inline int a8_group_code(int qtype, const uint8_t *wg, int l, int j, int i) {
    if (qtype == A8_Q8_0) return wg[j * 64 + l * 4 + i];
    const uint8_t b = wg[(j & 3) * 64 + l * 4 + i];
    const int u = j < 4 ? b & 0x0f : b >> 4;
    if (a8_high_bits(qtype) == 1) return u | (wg[256 + l * 4 + i] >> j & 1) << 4;
    if (a8_high_bits(qtype) == 2) return u | (wg[256 + (j / 4) * 64 + l * 4 + i] >> 2 * (j % 4) & 3) << 4;
    return u;
}

/* lane l's d and m (Q6_K: the d of its first and of its last sixteen weights), the VNNI path's products */
static inline void a8_group_scales(int qtype, const uint8_t *wg, int l, float *d, float *m) {
    const uint8_t *s = wg + a8_group_code_bytes(qtype);
    if (qtype == A8_Q6_K) {
        const float sup = a8_f16(s + 32 + 2 * (l / 8));
        *d = sup * (float)(int8_t)s[l], *m = sup * (float)(int8_t)s[16 + l];
    } else if (a8_k_min(qtype)) {
        *d = a8_f16(s + 32 + 2 * (l / 8)) * (float)s[l], *m = -(a8_f16(s + 36 + 2 * (l / 8)) * (float)s[16 + l]);
    } else {
        *d = a8_f16(s + 2 * l);
        *m = a8_f16_min(qtype) ? a8_f16(s + 32 + 2 * l) : *d * a8_min_factor(qtype);
    }
}

static void a8_output_rows(const int qtype, const uint8_t *xq, int64_t xb, int64_t M, int64_t K, const uint8_t *w,
                           int64_t rb, int64_t n0, int NB, float *y, int64_t N) {
    const int64_t G = a8_groups(K), P = a8_pairs(K);
    const int cb = a8_pair_code_bytes(qtype), gb = a8_group_bytes(qtype), pb = a8_pair_bytes(qtype);
    const float mk = a8_min_factor(qtype);
    for (int n = 0; n < NB; n++) {
        const uint8_t *wr = w + (n0 + n) * rb;
        for (int64_t r = 0; r < M; r++) {
            const uint8_t *xr = xq + r * xb;
            float acc[16] = {0};
            for (int64_t g = 0; g < G; g++) {
                const uint8_t *wg = wr + g * gb, *xg = xr + g * A8_XGROUP;
                const float *dx = (const float *)(xg + 512), *sx = (const float *)(xg + 576);
                for (int l = 0; l < 16; l++) {
                    int32_t is = 0, is_low = 0;
                    for (int j = 0; j < 8; j++)
                        for (int i = 0; i < 4; i++) {
                            const int u = a8_group_code(qtype, wg, l, j, i);
                            is += u * (int)(int8_t)xg[j * 64 + l * 4 + i];
                            is_low += j < 4 ? u * (int)(int8_t)xg[j * 64 + l * 4 + i] : 0;
                        }
                    float d, m;
                    a8_group_scales(qtype, wg, l, &d, &m);
                    if (qtype == A8_Q6_K) {
                        const float dl = d, dh = m;
                        const float *sxl = (const float *)(xg + 640), *sxh = (const float *)(xg + 704);
                        acc[l] = fmaf(dl * dx[l], (float)is_low, acc[l]);
                        acc[l] = fmaf(dh * dx[l], (float)(is - is_low), acc[l]);
                        acc[l] = fmaf(dl * mk, sxl[l], acc[l]);
                        acc[l] = fmaf(dh * mk, sxh[l], acc[l]);
                        continue;
                    }
                    const float ddx = d * dx[l];
                    acc[l] = fmaf(ddx, (float)is, acc[l]);
                    acc[l] = fmaf(m, sx[l], acc[l]);
                }
            }
            for (int64_t p = 0; p < P; p++) {
                const uint8_t *wp = wr + G * gb + p * pb, *xp = xr + G * A8_XGROUP + p * A8_XPAIR;
                const float *dx = (const float *)(xp + 64), *sx = (const float *)(xp + 128);
                for (int l = 0; l < 16; l++) {
                    const int half = l / 8;
                    int32_t is = 0;
                    for (int i = 0; i < 4; i++) {
                        const int e = (l % 8) * 4 + i; /* element of block A (half 0) or B (half 1) */
                        const int u = a8_pair_byte_codes(qtype) ? wp[half * 32 + e] : half ? wp[e] >> 4 : wp[e] & 0x0f;
                        is += u * (int)(int8_t)xp[half * 32 + e];
                    }
                    const uint8_t *s = wp + 2 * cb;
                    if (qtype == A8_Q6_K) { /* dA_lo dB_lo dA_hi dB_hi; lanes 4-7 of a block hold its second half */
                        const float d = a8_f32(s + 4 * (half + 2 * (l % 8 >= 4))), *sxq = (const float *)(xp + 192);
                        acc[l] = fmaf(d * dx[l], (float)is, acc[l]);
                        acc[l] = fmaf(d * mk, sxq[l], acc[l]);
                        continue;
                    }
                    const float d = a8_k_min(qtype) ? a8_f32(s + 4 * half) : a8_f16(s + 2 * half);
                    const float m = a8_f16_min(qtype)  ? a8_f16(s + 4 + 2 * half)
                                    : a8_k_min(qtype)  ? a8_f32(s + 8 + 4 * half)
                                                       : d * mk;
                    const float ddx = d * dx[l];
                    acc[l] = fmaf(ddx, (float)is, acc[l]);
                    acc[l] = fmaf(m, sx[l], acc[l]);
                }
            }
            y[r * N + n0 + n] = a8_hsum16(acc);
        }
    }
}
#endif

/* x [M, K] fp32 times the a8-packed [N, K] matrix (hyspec_qgemm_a8_pack) -> y [M, N] fp32.  Returns 0,
 * -1 on bad arguments, -2 when out of memory. */
int hyspec_qgemm_a8(int qtype, const float *x, int64_t M, int64_t K, const uint8_t *w, int64_t N, float *y) {
    const int64_t rb = hyspec_qgemm_a8_row_bytes(qtype, K);
    if (rb < 0 || M < 0 || N < 0) return -1;
    if (M == 0 || N == 0) return 0;
    const int64_t xb = a8_xrow_bytes(K);
    uint8_t *xq = aligned_alloc(64, (size_t)(M * xb));
    if (!xq) return -2;
    for (int64_t r = 0; r < M; r++) a8_quantize_row(x + r * K, K, xq + r * xb);
    const int64_t nblocks = (N + 3) / 4;
#pragma omp parallel for schedule(static)
    for (int64_t b = 0; b < nblocks; b++) {
        const int64_t n0 = b * 4;
        const int NB = N - n0 >= 4 ? 4 : (int)(N - n0);
        switch (qtype) {
            case A8_Q4_0: a8_output_rows(A8_Q4_0, xq, xb, M, K, w, rb, n0, NB, y, N); break;
            case A8_Q4_1: a8_output_rows(A8_Q4_1, xq, xb, M, K, w, rb, n0, NB, y, N); break;
            case A8_Q5_0: a8_output_rows(A8_Q5_0, xq, xb, M, K, w, rb, n0, NB, y, N); break;
            case A8_Q5_1: a8_output_rows(A8_Q5_1, xq, xb, M, K, w, rb, n0, NB, y, N); break;
            case A8_Q4_K: a8_output_rows(A8_Q4_K, xq, xb, M, K, w, rb, n0, NB, y, N); break;
            case A8_Q5_K: a8_output_rows(A8_Q5_K, xq, xb, M, K, w, rb, n0, NB, y, N); break;
            case A8_Q6_K: a8_output_rows(A8_Q6_K, xq, xb, M, K, w, rb, n0, NB, y, N); break;
            default: a8_output_rows(A8_Q8_0, xq, xb, M, K, w, rb, n0, NB, y, N); break;
        }
    }
    free(xq);
    return 0;
}
