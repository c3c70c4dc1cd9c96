/*
 * The GGUF types a Q4_K_M / Q5_K_M file holds besides Q4_0 / Q4_1 / Q8_0 / Q5_0, computed from their stored blocks:
 * Q5_1 (32 weights a block) and the K-quants Q4_K, Q5_K, Q6_K (256 weights a super-block).  (Q5_0, the type of most
 * of a Q4_K_M file's matrices, is computed in qgemm.c as Q8_0 is.)
 * Included by qgemm.c after its ISA section (it uses that section's f16, hsum / hsum16, q5_codes and ISA macros);
 * hyspec_qgemm hands these types to kq_gemm.
 *
 * Layouts, as the gguf package's quants.py reads them (llama.cpp's ggml-common.h block_q4_K etc. for
 * reference; github.com/ggml-org/llama.cpp, ggml/src/ggml-common.h):
 *   Q5_1  fp16 d, fp16 m, 4 bytes qh, 16 bytes qs   w = d * q + m
 *         q = nibble j of qs (low nibbles elements 0..15, high 16..31) | bit j of qh << 4
 *   Q4_K  fp16 d, fp16 dmin, 12 bytes of 6-bit scales and mins, 128 bytes qs      w = (d sc) q - dmin mn
 *         eight sub-blocks of 32; sub-block 2c / 2c+1 are the low / high nibbles of qs[32c .. 32c+31]
 *   Q5_K  as Q4_K with 32 bytes qh before qs: bit i of qh[e] is the fifth bit of sub-block i's element e
 *   Q6_K  128 bytes ql, 64 bytes qh, 16 int8 scales, fp16 d     w = (d sc) (q - 32), a scale per 16
 *         element h*128 + r: low four bits (ql[64h + r%64] >> 4(r/64)), high two (qh[32h + r%32] >> 2(r/32))
 *
 * Each block is dequantized to the fp32 values gguf's dequantize gives, bit for bit: (d sc), dmin mn and
 * d q are exact fp32 products (at most 11 + 6 + 5 significant bits), so (d sc) q - dmin mn and d q + m are
 * rounded once whether computed as an fma or as gguf's product-then-add; Q6_K's (d sc) (q - 32) is rounded
 * once in both, in the same order.  Then w * x is summed in one fixed lane order (kq_dot32), the order the
 * F32_ROWS type uses on a dense fp32 matrix: so the kernel's result on blocks equals, bit for bit, the same
 * kernel on gguf's dequantized matrix (tests/test_cpu_ops_kquants.py).  Rows of x never share sums, and
 * blocking depends on nothing but the row's own position: a row's result is the same alone or in a batch.
 */

enum { Q5_1 = 4, Q4_K = 5, Q5_K = 6, Q6_K = 7, F32_ROWS = 8, LAST_QTYPE = 8 };

static inline int kq_block_elems(int t) { return t == Q5_1 || t == F32_ROWS ? 32 : 256; }
static inline int kq_block_bytes(int t) {
    return t == Q5_1 ? 24 : t == Q4_K ? 144 : t == Q5_K ? 176 : t == Q6_K ? 210 : 128;
}

/* sub-block i (0..7) of a Q4_K / Q5_K super-block: its 6-bit scale and min from the 12 packed bytes */
static inline void kq_scale_min(const uint8_t *s, int i, int *sc, int *mn) {
    if (i < 4) {
        *sc = s[i] & 63;
        *mn = s[i + 4] & 63;
    } else {
        *sc = (s[i + 4] & 0x0F) | ((s[i - 4] >> 6) << 4);
        *mn = (s[i + 4] >> 4) | ((s[i] >> 6) << 4);
    }
}

/* The one summation order of these types: per 32 weights of the row (index g32 along K), w * x into
 * 32 lanes -- AVX2 and portable: four 8-lane accumulators, weights 8i..8i+7 into accumulator i;
 * AVX-512: two 16-lane accumulators, alternating between two pairs with g32's parity -- then the
 * accumulators added pairwise and the lanes summed (hsum / hsum8 / hsum16). */
#if defined(HYSPEC_AVX512)
typedef struct { __m512 v[4]; } kq_acc;
static inline void kq_zero(kq_acc *a) { for (int i = 0; i < 4; i++) a->v[i] = _mm512_setzero_ps(); }
static inline __attribute__((always_inline)) void kq_dot32(kq_acc *a, const float *w, const float *x, int64_t g32) {
    const int p = (int)(g32 & 1) * 2;
    a->v[p] = _mm512_fmadd_ps(_mm512_loadu_ps(w), _mm512_loadu_ps(x), a->v[p]);
    a->v[p + 1] = _mm512_fmadd_ps(_mm512_loadu_ps(w + 16), _mm512_loadu_ps(x + 16), a->v[p + 1]);
}
static inline float kq_sum(const kq_acc *a) {
    return hsum16(_mm512_add_ps(_mm512_add_ps(a->v[0], a->v[1]), _mm512_add_ps(a->v[2], a->v[3])));
}
#elif defined(HYSPEC_AVX2)
typedef struct { __m256 v[4]; } kq_acc;
static inline void kq_zero(kq_acc *a) { for (int i = 0; i < 4; i++) a->v[i] = _mm256_setzero_ps(); }
static inline __attribute__((always_inline)) void kq_dot32(kq_acc *a, const float *w, const float *x, int64_t g32) {
    (void)g32;
    for (int i = 0; i < 4; i++)
        a->v[i] = _mm256_fmadd_ps(_mm256_loadu_ps(w + 8 * i), _mm256_loadu_ps(x + 8 * i), a->v[i]);
}
static inline float kq_sum(const kq_acc *a) {
    return hsum(_mm256_add_ps(_mm256_add_ps(a->v[0], a->v[1]), _mm256_add_ps(a->v[2], a->v[3])));
}
#else
typedef struct { float v[4][8]; } kq_acc;
static inline void kq_zero(kq_acc *a) { memset(a, 0, sizeof(*a)); }
static inline void kq_dot32(kq_acc *a, const float *w, const float *x, int64_t g32) {
    (void)g32;
    for (int i = 0; i < 4; i++)
        for (int l = 0; l < 8; l++) a->v[i][l] = __builtin_fmaf(w[8 * i + l], x[8 * i + l], a->v[i][l]);
}
static inline float kq_sum(const kq_acc *a) {
    float s[8];
    for (int l = 0; l < 8; l++) s[l] = (a->v[0][l] + a->v[1][l]) + (a->v[2][l] + a->v[3][l]);
    return hsum8(s);
}
#endif

#if defined(HYSPEC_AVX512) || defined(HYSPEC_AVX2)
/* 32 codes (bytes, unsigned; signed for Q6_K) to fp32, then q * s + b (fma: one rounding of an exact
 * product plus b) or q * s (b_none); s0 scales codes 0..15, s1 codes 16..31.  The weights go to out[0..31]
 * (R = 0), or (fused: R rows of x, xs floats apart, R compile-time) straight into each row's accumulators
 * acc[r] with x[r xs + 0..31], as kq_dot32 would add them. */
static inline __attribute__((always_inline)) void kq_store32(__m256i q, int is_signed, float s0, float s1, float b,
                                                             int b_none, float *out, const int R, kq_acc *acc,
                                                             const float *x, int64_t xs, int64_t g32) {
    const __m128i q0 = _mm256_castsi256_si128(q), q1 = _mm256_extracti128_si256(q, 1);
#if defined(HYSPEC_AVX512)
    const __m512 vs0 = _mm512_set1_ps(s0), vs1 = _mm512_set1_ps(s1), vb = _mm512_set1_ps(b);
    const __m512 f0 = _mm512_cvtepi32_ps(is_signed ? _mm512_cvtepi8_epi32(q0) : _mm512_cvtepu8_epi32(q0));
    const __m512 f1 = _mm512_cvtepi32_ps(is_signed ? _mm512_cvtepi8_epi32(q1) : _mm512_cvtepu8_epi32(q1));
    const __m512 w0 = b_none ? _mm512_mul_ps(f0, vs0) : _mm512_fmadd_ps(f0, vs0, vb);
    const __m512 w1 = b_none ? _mm512_mul_ps(f1, vs1) : _mm512_fmadd_ps(f1, vs1, vb);
    if (R) {
        const int p = (int)(g32 & 1) * 2;
        for (int r = 0; r < R; r++) {
            acc[r].v[p] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(x + r * xs), acc[r].v[p]);
            acc[r].v[p + 1] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(x + r * xs + 16), acc[r].v[p + 1]);
        }
    } else {
        _mm512_storeu_ps(out, w0);
        _mm512_storeu_ps(out + 16, w1);
    }
#else
    const __m256 vb = _mm256_set1_ps(b);
    const __m128i parts[4] = {q0, _mm_srli_si128(q0, 8), q1, _mm_srli_si128(q1, 8)};
    for (int i = 0; i < 4; i++) {
        const __m256 vs = _mm256_set1_ps(i < 2 ? s0 : s1);
        const __m256i wide = is_signed ? _mm256_cvtepi8_epi32(parts[i]) : _mm256_cvtepu8_epi32(parts[i]);
        const __m256 f = _mm256_cvtepi32_ps(wide);
        const __m256 w = b_none ? _mm256_mul_ps(f, vs) : _mm256_fmadd_ps(f, vs, vb);
        for (int r = 0; r < R; r++) acc[r].v[i] = _mm256_fmadd_ps(w, _mm256_loadu_ps(x + r * xs + 8 * i), acc[r].v[i]);
        if (!R) _mm256_storeu_ps(out + 8 * i, w);
    }
    (void)g32;
#endif
}

/* block b's weights into out[] (R = 0), or (fused) w * x into the accumulators of R rows of x, xs floats apart; x: the
 * block's first column of the first row, g0: the index of the block's first 32 weights along K (only its parity is
 * read: AVX-512 alternates accumulator pairs with it) */
static inline __attribute__((always_inline)) void kq_dequant(const int qtype, const uint8_t *b, float *out,
                                                             const int R, kq_acc *acc, const float *x, int64_t xs,
                                                             int64_t g0) {
    if (qtype == Q5_1) {
        kq_store32(q5_codes(b + 4, b + 8, 0), 0, f16(b), f16(b), f16(b + 2), 0, out, R, acc, x, xs, g0);
        return;
    }
    if (qtype == Q6_K) {
        const float d = f16(b + 208);
        const int8_t *sc = (const int8_t *)(b + 192);
        const __m256i m4 = _mm256_set1_epi8(0x0F), m2 = _mm256_set1_epi8(3), k32 = _mm256_set1_epi8(32);
        /* unrolled, so that each kq_store32's accumulator pair is known at compile time (with four rows of x the
         * compiler otherwise left the k loop rolled and the accumulators in memory) */
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            const __m256i qh = _mm256_loadu_si256((const __m256i *)(b + 128 + 32 * h));
#pragma GCC unroll 4
            for (int k = 0; k < 4; k++) {
                const __m256i ql = _mm256_loadu_si256((const __m256i *)(b + 64 * h + 32 * (k & 1)));
                const __m256i lo = _mm256_and_si256(k >> 1 ? _mm256_srli_epi16(ql, 4) : ql, m4);
                const __m256i hi = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * k)), m2);
                const __m256i q = _mm256_sub_epi8(_mm256_or_si256(lo, _mm256_slli_epi16(hi, 4)), k32);
                const int t = 128 * h + 32 * k; /* two scales in these 32: elements t..t+15 and t+16..t+31 */
                kq_store32(q, 1, d * (float)sc[t / 16], d * (float)sc[t / 16 + 1], 0.0f, 1, out + t, R, acc,
                           x + t, xs, g0 + t / 32);
            }
        }
        return;
    }
    /* Q4_K, Q5_K */
    const float d = f16(b), dmin = f16(b + 2);
    const uint8_t *s = b + 4, *qs = b + (qtype == Q5_K ? 48 : 16);
#if defined(HYSPEC_AVX512)
    if (qtype == Q4_K && R) {
        /* Rows of x straight from the block: a sub-block's sixteen possible values, fma(q, d sc, -dmin mn) for
         * q = 0..15, in one register, indexed by the codes (vpermps reads an index's low four bits, so a widened
         * byte indexes its low nibble as it is and its high nibble after one shift): the values kq_store32
         * computes, for fewer instructions than converting and scaling each code.  (Dequantizing into a buffer
         * for many rows, the conversion below was as fast or faster.) */
        const __m512 iota = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
        for (int c = 0; c < 4; c++) {
            __m512 table[2];
            for (int h = 0; h < 2; h++) {
                int sc, mn;
                kq_scale_min(s, 2 * c + h, &sc, &mn);
                table[h] = _mm512_fmadd_ps(iota, _mm512_set1_ps(d * (float)sc), _mm512_set1_ps(-(dmin * (float)mn)));
            }
            const __m512i q0 = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(qs + 32 * c)));
            const __m512i q1 = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(qs + 32 * c + 16)));
            for (int h = 0; h < 2; h++) { /* sub-block 2c + h: even ones into accumulators 0, 1, odd into 2, 3 */
                const __m512 w0 = _mm512_permutexvar_ps(h ? _mm512_srli_epi32(q0, 4) : q0, table[h]);
                const __m512 w1 = _mm512_permutexvar_ps(h ? _mm512_srli_epi32(q1, 4) : q1, table[h]);
                const int i = 2 * c + h;
                for (int r = 0; r < R; r++) {
                    const float *xr = x + r * xs + 32 * i;
                    acc[r].v[2 * h] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(xr), acc[r].v[2 * h]);
                    acc[r].v[2 * h + 1] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(xr + 16), acc[r].v[2 * h + 1]);
                }
            }
        }
        (void)g0, (void)out; /* a super-block starts on an even group of 32 */
        return;
    }
#endif
    const __m256i m4 = _mm256_set1_epi8(0x0F), one = _mm256_set1_epi8(1);
    const __m256i qh = qtype == Q5_K ? _mm256_loadu_si256((const __m256i *)(b + 16)) : _mm256_setzero_si256();
    for (int c = 0; c < 4; c++) {
        const __m256i raw = _mm256_loadu_si256((const __m256i *)(qs + 32 * c));
        for (int h = 0; h < 2; h++) {
            const int i = 2 * c + h;
            int sc, mn;
            kq_scale_min(s, i, &sc, &mn);
            __m256i q = _mm256_and_si256(h ? _mm256_srli_epi16(raw, 4) : raw, m4);
            if (qtype == Q5_K)
                q = _mm256_or_si256(q, _mm256_slli_epi16(
                                           _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(i)), one), 4));
            kq_store32(q, 0, d * (float)sc, d * (float)sc, -(dmin * (float)mn), 0, out + 32 * i, R, acc,
                       x + 32 * i, xs, g0 + i);
        }
    }
}
#else
/* portable: the same values, one at a time (every product below is exact, see the header) */
static inline void kq_dequant(const int qtype, const uint8_t *b, float *out) {
    if (qtype == Q5_1) {
        uint32_t qh;
        memcpy(&qh, b + 4, 4);
        const uint8_t *qs = b + 8;
        const float d = f16(b), m = f16(b + 2);
        for (int j = 0; j < 32; j++) {
            const int q = (j < 16 ? qs[j] & 0x0F : qs[j - 16] >> 4) | (int)((qh >> j) & 1) << 4;
            out[j] = d * (float)q + m;
        }
        return;
    }
    if (qtype == Q6_K) {
        const float d = f16(b + 208);
        const int8_t *sc = (const int8_t *)(b + 192);
        for (int t = 0; t < 256; t++) {
            const int h = t / 128, r = t % 128;
            const int lo = (b[64 * h + r % 64] >> (4 * (r / 64))) & 0x0F;
            const int hi = (b[128 + 32 * h + r % 32] >> (2 * (r / 32))) & 3;
            out[t] = (d * (float)sc[t / 16]) * (float)((lo | hi << 4) - 32);
        }
        return;
    }
    const float d = f16(b), dmin = f16(b + 2);
    const uint8_t *s = b + 4, *qh = b + 16, *qs = b + (qtype == Q5_K ? 48 : 16);
    for (int i = 0; i < 8; i++) {
        int sc, mn;
        kq_scale_min(s, i, &sc, &mn);
        const float ds = d * (float)sc, dm = dmin * (float)mn;
        for (int e = 0; e < 32; e++) {
            int q = (qs[32 * (i / 2) + e] >> (4 * (i % 2))) & 0x0F;
            if (qtype == Q5_K) q |= ((qh[e] >> i) & 1) << 4;
            out[32 * i + e] = ds * (float)q - dm;
        }
    }
}
#endif

#if defined(HYSPEC_AVX2)
/* AVX2, one row of x: eight weights with integer codes q (dword lanes) into accumulator i, as kq_store32 adds them:
 * w = q * s (+ b, one fma), then w * x */
static inline __attribute__((always_inline)) void kq_fma8(kq_acc *a, const int i, __m256i q, float s, float b,
                                                          const int b_none, const float *x) {
    const __m256 f = _mm256_cvtepi32_ps(q), vs = _mm256_set1_ps(s);
    const __m256 w = b_none ? _mm256_mul_ps(f, vs) : _mm256_fmadd_ps(f, vs, _mm256_set1_ps(b));
    a->v[i] = _mm256_fmadd_ps(w, _mm256_loadu_ps(x), a->v[i]);
}

static inline __m256i kq_widen8(const uint8_t *p) { return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p)); }

/* One Q4_K / Q5_K super-block against one row of x into its accumulators, the sums kq_dequant's fused path takes
 * (each accumulator i receives the same w * x in the same order; accumulators are independent, so the loops may run
 * chunk-major).  The codes are widened to dword lanes straight from the block, eight bytes at a time, one widening
 * for the two sub-blocks whose nibbles they hold: widening 32 codes from a register took extracts and shifts on
 * the shuffle ports, the one-row loop's bottleneck.  (Q6_K stays on kq_dequant: its six-bit codes are assembled
 * more cheaply as bytes, and in dword lanes it ran 1.4x slower.) */
static inline __attribute__((always_inline)) void kq_superblock_dot(const int qtype, const uint8_t *b, kq_acc *acc,
                                                                    const float *x) {
    const __m256i m4 = _mm256_set1_epi32(0x0F);
    const float d = f16(b), dmin = f16(b + 2);
    const uint8_t *s = b + 4, *qs = b + (qtype == Q5_K ? 48 : 16), *qh = b + 16;
    const __m256i one = _mm256_set1_epi32(1);
    for (int c = 0; c < 4; c++) {
        float sc[2], bias[2];
        for (int h = 0; h < 2; h++) {
            int scale, mn;
            kq_scale_min(s, 2 * c + h, &scale, &mn);
            sc[h] = d * (float)scale;
            bias[h] = -(dmin * (float)mn);
        }
        for (int k = 0; k < 4; k++) { /* elements 8k..8k+7 of sub-blocks 2c and 2c+1: accumulator k */
            const __m256i bytes = kq_widen8(qs + 32 * c + 8 * k);
            __m256i lo = _mm256_and_si256(bytes, m4), hi = _mm256_srli_epi32(bytes, 4);
            if (qtype == Q5_K) { /* bit i of qh[e]: sub-block i's element e */
                const __m256i hb = kq_widen8(qh + 8 * k);
                const __m256i b0 = _mm256_srl_epi32(hb, _mm_cvtsi32_si128(2 * c));
                const __m256i b1 = _mm256_srl_epi32(hb, _mm_cvtsi32_si128(2 * c + 1));
                lo = _mm256_or_si256(lo, _mm256_slli_epi32(_mm256_and_si256(b0, one), 4));
                hi = _mm256_or_si256(hi, _mm256_slli_epi32(_mm256_and_si256(b1, one), 4));
            }
            kq_fma8(acc, k, lo, sc[0], bias[0], 0, x + 64 * c + 8 * k);
            kq_fma8(acc, k, hi, sc[1], bias[1], 0, x + 64 * c + 32 + 8 * k);
        }
    }
}
#endif

#if defined(HYSPEC_AVX512) || defined(HYSPEC_AVX2)
/* NR (1 or 2, compile-time) output rows, rowbytes apart from wr, against one row of x: each block's weights go
 * from registers into that output's sums, y[0] and y[1].  The accumulators are local structs, so they stay in
 * registers (indexed out of an array of rows they were stored and reloaded every block: a store-forwarding round
 * trip on every fma chain); two outputs give the out-of-order core two independent dequantizations per step. */
static inline __attribute__((always_inline)) void kq_rows_dot(const int qtype, const int NR, const float *x, int64_t K,
                                                              const uint8_t *wr, int64_t rowbytes, float *y) {
    const int E = kq_block_elems(qtype), B = kq_block_bytes(qtype);
    const int64_t G = K / E;
    /* Q5_1 (32 weights a block): two blocks a step, so that the block's parity, which picks the AVX-512
     * accumulator pair, is known at compile time (a run-time index put the accumulators on the stack).  A
     * super-block's first group of 32 is always even.  kq_dequant reads only that parity of its g0. */
    const int S = E == 32 ? 2 : 1;
    kq_acc a0, a1;
    kq_zero(&a0);
    kq_zero(&a1);
    for (int64_t g0 = 0; g0 < G; g0 += S) {
        for (int j = 0; j < S && g0 + j < G; j++) {
            const int64_t g = g0 + j;
            const uint8_t *b = wr + g * B;
            _mm_prefetch((const char *)(b + PREFETCH_BYTES_ONE_ROW), _MM_HINT_T0);
#if defined(HYSPEC_AVX2)
            if (qtype == Q4_K || qtype == Q5_K) kq_superblock_dot(qtype, b, &a0, x + g * E);
            else
#endif
            kq_dequant(qtype, b, NULL, 1, &a0, x + g * E, 0, j);
            if (NR == 2) {
                _mm_prefetch((const char *)(b + rowbytes + PREFETCH_BYTES_ONE_ROW), _MM_HINT_T0);
                kq_dequant(qtype, b + rowbytes, NULL, 1, &a1, x + g * E, 0, j);
            }
        }
    }
    y[0] = kq_sum(&a0);
    if (NR == 2) y[1] = kq_sum(&a1);
}

/* A few rows of x (verification of a short draft, a small batch): one output row (its blocks at wr) against R rows
 * of x (2..KQ_FEW_ROWS, compile-time), each block dequantized in registers once and its weights taken by every row.
 * (Through the many-rows path's buffer, two rows of x cost as much as two single rows: the store and reload of
 * every weight outweigh what the second row shares.)  Each row's accumulators take the products kq_rows_dot gives
 * it alone, in the same order. */
enum { KQ_FEW_ROWS = 4 };
/* Up to this many rows of x take kq_few_dot in chunks, past it the many-rows path: the crossovers measured on
 * SmolLM2's Q4_K_M and Q5_K_M matrices (scripts/bench_qgemm_types.py).  Q6_K's codes cost the most to assemble, so
 * sharing them pays longest; AVX2's sixteen registers hold four rows' accumulators and nothing else. */
static inline int kq_few_max(int qtype) {
#if defined(HYSPEC_AVX512)
    return qtype == Q6_K ? 16 : qtype == Q5_1 ? 8 : 12;
#else
    return qtype == Q6_K ? 8 : 4;
#endif
}
static inline __attribute__((always_inline)) void kq_few_dot(const int qtype, const int R, const float *x, int64_t K,
                                                             const uint8_t *wr, float *y, int64_t N) {
    const int E = kq_block_elems(qtype), B = kq_block_bytes(qtype);
    const int64_t G = K / E;
    const int S = E == 32 ? 2 : 1; /* as kq_rows_dot: the group's parity known at compile time */
    kq_acc a[KQ_FEW_ROWS];
    for (int r = 0; r < R; r++) kq_zero(&a[r]);
    for (int64_t g0 = 0; g0 < G; g0 += S) {
        for (int j = 0; j < S && g0 + j < G; j++) {
            const int64_t g = g0 + j;
            const uint8_t *b = wr + g * B;
            _mm_prefetch((const char *)(b + PREFETCH_BYTES_ONE_ROW), _MM_HINT_T0);
            kq_dequant(qtype, b, NULL, R, a, x + g * E, K, j);
        }
    }
    for (int r = 0; r < R; r++) y[r * N] = kq_sum(&a[r]);
}
#endif

/* One output row (its blocks at wr) against every row of x, eight rows at a time: each block is
 * dequantized once per chunk of rows into an L1 buffer, then every row of the chunk takes its w * x. */
static inline __attribute__((always_inline)) void kq_output_row(const int qtype, const float *x, int64_t M, int64_t K,
                                                                const uint8_t *wr, float *y, int64_t N) {
    const int E = kq_block_elems(qtype), B = kq_block_bytes(qtype);
    const int64_t G = K / E;
    float buf[256] __attribute__((aligned(64)));
    for (int64_t m0 = 0; m0 < M; m0 += ROW_CHUNK) {
        const int R = M - m0 < ROW_CHUNK ? (int)(M - m0) : ROW_CHUNK;
#if defined(HYSPEC_AVX512) || defined(HYSPEC_AVX2)
        if (qtype != F32_ROWS && R == 1) {
            kq_rows_dot(qtype, 1, x + m0 * K, K, wr, 0, y + m0 * N);
            continue;
        }
#endif
        kq_acc acc[ROW_CHUNK];
        for (int r = 0; r < R; r++) kq_zero(&acc[r]);
        for (int64_t g = 0; g < G; g++) {
            const uint8_t *b = wr + g * B;
#if defined(HYSPEC_AVX512) || defined(HYSPEC_AVX2)
            _mm_prefetch((const char *)(b + PREFETCH_BYTES), _MM_HINT_T0);
#endif
            const float *w = (const float *)b; /* F32_ROWS: the row's own values */
#if defined(HYSPEC_AVX512) || defined(HYSPEC_AVX2)
            if (qtype != F32_ROWS) {
                kq_dequant(qtype, b, buf, 0, NULL, NULL, 0, 0);
                w = buf;
            }
#else
            if (qtype != F32_ROWS) {
                kq_dequant(qtype, b, buf);
                w = buf;
            }
#endif
            for (int r = 0; r < R; r++) {
                const float *xg = x + (m0 + r) * K + g * E;
                for (int t = 0; t < E / 32; t++) kq_dot32(&acc[r], w + 32 * t, xg + 32 * t, g * (E / 32) + t);
            }
        }
        for (int r = 0; r < R; r++) y[(m0 + r) * N] = kq_sum(&acc[r]);
    }
}

#if defined(HYSPEC_AVX512) || defined(HYSPEC_AVX2)
/* Many rows of x (verification, prefill): KQ_TILE_ROWS rows of x (R of them here, compile-time) against one or two
 * output rows already dequantized to fp32 (wd, K values each): each weight vector loaded once for the R rows, the
 * rows' accumulators in registers.  Every (output, row) pair adds w * x through kq_dot32 in K order, as
 * kq_output_row does: the results are equal. */
enum { KQ_TILE_ROWS = 3 };
/* Output rows a tile takes: two on AVX-512, so that each x vector loaded feeds two outputs' fmas (kq_tile2, with
 * weights and x held in registers), except on short rows, where one was 3 % faster (Q5_1 576-wide rows; 1536-wide
 * K-quant rows ran 15-28 % faster with two, scripts/bench_qgemm_types.py).  AVX2's sixteen registers hold one
 * output's tile. */
static inline int kq_tile_outputs(int64_t K) {
#if defined(HYSPEC_AVX512)
    return K >= 1024 ? 2 : 1;
#else
    (void)K;
    return 1;
#endif
}

static inline __attribute__((always_inline)) void kq_tile(const int R, const float *wd, const float *x, int64_t K,
                                                          float *y, int64_t N) {
    kq_acc acc[KQ_TILE_ROWS];
    for (int r = 0; r < R; r++) kq_zero(&acc[r]);
    /* Two groups of 32 a step, so that the AVX-512 kq_dot32's accumulator pair (chosen by the group's parity) is
     * known at compile time: indexed at run time, the accumulators lived on the stack, a store and a reload around
     * every fma.  Each accumulator still takes its products in K order. */
    const int64_t T = K / 32;
    int64_t t = 0;
    for (; t + 1 < T; t += 2) {
        for (int r = 0; r < R; r++) kq_dot32(&acc[r], wd + 32 * t, x + r * K + 32 * t, 0);
        for (int r = 0; r < R; r++) kq_dot32(&acc[r], wd + 32 * t + 32, x + r * K + 32 * t + 32, 1);
    }
    if (t < T) /* t is even here */
        for (int r = 0; r < R; r++) kq_dot32(&acc[r], wd + 32 * t, x + r * K + 32 * t, 0);
    for (int r = 0; r < R; r++) y[r * N] = kq_sum(&acc[r]);
}

#if defined(HYSPEC_AVX512)
/* Group t of two outputs (u, v: its 32 weights each) against R rows of x, into accumulator pair P (t's parity,
 * compile-time: indexed at run time the accumulators went to the stack, as in kq_tile). */
static inline __attribute__((always_inline)) void kq_group2(const int R, const int P, const float *u, const float *v,
                                                            const float *x, int64_t K, kq_acc *a0, kq_acc *a1) {
    __m512 u0 = _mm512_loadu_ps(u), u1 = _mm512_loadu_ps(u + 16), v0 = _mm512_loadu_ps(v), v1 = _mm512_loadu_ps(v + 16);
    __asm__("" : "+v"(u0), "+v"(u1), "+v"(v0), "+v"(v1));
    for (int r = 0; r < R; r++) {
        __m512 x0 = _mm512_loadu_ps(x + r * K), x1 = _mm512_loadu_ps(x + r * K + 16);
        /* weights and x in registers, each loaded once: left to GCC, it folded a load into every fma and the
         * tile ran on the load ports, no faster than one output a tile */
        __asm__("" : "+v"(x0), "+v"(x1));
        a0[r].v[P] = _mm512_fmadd_ps(u0, x0, a0[r].v[P]), a0[r].v[P + 1] = _mm512_fmadd_ps(u1, x1, a0[r].v[P + 1]);
        a1[r].v[P] = _mm512_fmadd_ps(v0, x0, a1[r].v[P]), a1[r].v[P + 1] = _mm512_fmadd_ps(v1, x1, a1[r].v[P + 1]);
    }
}

/* kq_tile for two output rows (wd and wd + K) at once: each x vector loaded feeds both outputs' fmas.  The same
 * products into the same accumulators in the same order as two kq_tile calls. */
static inline __attribute__((always_inline)) void kq_tile2(const int R, const float *wd, const float *x, int64_t K,
                                                           float *y, int64_t N) {
    kq_acc a0[KQ_TILE_ROWS], a1[KQ_TILE_ROWS];
    for (int r = 0; r < R; r++) kq_zero(&a0[r]), kq_zero(&a1[r]);
    const float *w1 = wd + K;
    const int64_t T = K / 32;
    int64_t t = 0;
    for (; t + 1 < T; t += 2) {
        kq_group2(R, 0, wd + 32 * t, w1 + 32 * t, x + 32 * t, K, a0, a1);
        kq_group2(R, 2, wd + 32 * t + 32, w1 + 32 * t + 32, x + 32 * t + 32, K, a0, a1);
    }
    if (t < T) kq_group2(R, 0, wd + 32 * t, w1 + 32 * t, x + 32 * t, K, a0, a1);
    for (int r = 0; r < R; r++) y[r * N] = kq_sum(&a0[r]), y[r * N + 1] = kq_sum(&a1[r]);
}

/* Out of line: inlined into the loop over output pairs, the same tiles ran ~10 % slower on 4096-wide rows. */
static __attribute__((noinline)) void kq_tile2_rows(const int R, const float *wd, const float *x, int64_t K, float *y,
                                                    int64_t N) {
    if (R == 3) kq_tile2(3, wd, x, K, y, N);
    else if (R == 2) kq_tile2(2, wd, x, K, y, N);
    else kq_tile2(1, wd, x, K, y, N);
}

#endif

/* Output rows n0 .. n0+NB-1 against every row of x: the NB rows dequantized once into wd (NB * K floats, L2), then
 * every tile of KQ_TILE_ROWS rows of x (in L1) passed over by all NB outputs before the next tile. */
static inline __attribute__((always_inline)) void kq_outputs_many(const int qtype, const int O, const float *x,
                                                                  int64_t M, int64_t K, const uint8_t *w,
                                                                  int64_t rowbytes, int64_t n0, int NB, float *wd,
                                                                  float *y, int64_t N) {
    const int E = kq_block_elems(qtype), B = kq_block_bytes(qtype);
    for (int i = 0; i < NB; i++) {
        const uint8_t *wr = w + (n0 + i) * rowbytes;
        for (int64_t g = 0; g < K / E; g++) {
            _mm_prefetch((const char *)(wr + g * B + PREFETCH_BYTES), _MM_HINT_T0);
            kq_dequant(qtype, wr + g * B, wd + i * K + g * E, 0, NULL, NULL, 0, 0);
        }
    }
    for (int64_t m0 = 0; m0 < M; m0 += KQ_TILE_ROWS) {
        const int R = M - m0 < KQ_TILE_ROWS ? (int)(M - m0) : KQ_TILE_ROWS;
        for (int i = 0; i < NB; i += O) {
            float *yt = y + m0 * N + n0 + i;
            const float *xt = x + m0 * K;
#if defined(HYSPEC_AVX512)
            if (O == 2 && i + 1 < NB) {
                kq_tile2_rows(R, wd + i * K, xt, K, yt, N);
                continue;
            }
#endif
            for (int o = i; o < NB && o < i + O; o++) {
                if (R == 3) kq_tile(3, wd + o * K, xt, K, yt + o - i, N);
                else if (R == 2) kq_tile(2, wd + o * K, xt, K, yt + o - i, N);
                else kq_tile(1, wd + o * K, xt, K, yt + o - i, N);
            }
        }
    }
}

/* Each (type, outputs a tile) in a function of its own: inlined together into the parallel region, the one-output
 * tiles on 576- and 1536-wide rows compiled 1.4x slower once the two-output ones were beside them. */
#define KQ_MANY_FN(T, O)                                                                                        \
    static __attribute__((noinline)) void kq_many_##T##_##O(const float *x, int64_t M, int64_t K,               \
                                                            const uint8_t *w, int64_t rowbytes, int64_t n0,     \
                                                            int NB, float *wd, float *y, int64_t N) {           \
        kq_outputs_many(T, O, x, M, K, w, rowbytes, n0, NB, wd, y, N);                                          \
    }
KQ_MANY_FN(Q5_1, 1)
KQ_MANY_FN(Q5_1, 2)
KQ_MANY_FN(Q4_K, 1)
KQ_MANY_FN(Q4_K, 2)
KQ_MANY_FN(Q5_K, 1)
KQ_MANY_FN(Q5_K, 2)
KQ_MANY_FN(Q6_K, 1)
KQ_MANY_FN(Q6_K, 2)
#undef KQ_MANY_FN

/* The many-rows kq_gemm: tasks of up to MANY_OUTPUTS output rows (at least four tasks a thread), each thread's
 * dequantized rows kept to about 64 KiB (fewer outputs at once for long rows).  Returns -2 when out of memory. */
static int kq_gemm_many(int qtype, const float *x, int64_t M, int64_t K, const uint8_t *w, int64_t N, float *y) {
    const int64_t rowbytes = K / kq_block_elems(qtype) * kq_block_bytes(qtype);
    const int64_t threads = omp_threads(), per = (N + 3) / 4 / (4 * threads);
    const int64_t step = 4 * (per < 1 ? 1 : per > MANY_OUTPUTS / 4 ? MANY_OUTPUTS / 4 : per);
    /* outputs dequantized at once: ~64 KiB of them, but at least a tile's worth (two rows of 11008 take 88 KiB) */
    const int O = kq_tile_outputs(K);
    const int64_t fit = 16384 / K < O ? O : 16384 / K, sub = fit < step ? fit : step;
    const int64_t ntasks = (N + step - 1) / step;
    int failed = 0;
#pragma omp parallel reduction(| : failed)
    {
        float *wd = aligned_alloc(64, (size_t)(sub * K * sizeof(float) + 63) / 64 * 64);
        if (!wd) failed = 1;
#pragma omp for schedule(static)
        for (int64_t b = 0; b < ntasks; b++) {
            for (int64_t n0 = b * step; wd && n0 < N && n0 < (b + 1) * step; n0 += sub) {
                const int64_t end = (b + 1) * step < N ? (b + 1) * step : N;
                const int NB = end - n0 < sub ? (int)(end - n0) : (int)sub;
                switch (qtype * 2 + (O == 2)) {
#define KQ_MANY(T)                                                                      \
    case T * 2: kq_many_##T##_1(x, M, K, w, rowbytes, n0, NB, wd, y, N); break;          \
    case T * 2 + 1: kq_many_##T##_2(x, M, K, w, rowbytes, n0, NB, wd, y, N); break;
                    KQ_MANY(Q5_1)
                    KQ_MANY(Q4_K)
                    KQ_MANY(Q5_K)
                    KQ_MANY(Q6_K)
#undef KQ_MANY
                }
            }
        }
        free(wd);
    }
    return failed ? -2 : 0;
}
#endif

/* x [M, K] fp32, w [N, K / E blocks of the type], y [M, N]; OpenMP over blocks of four output rows */
static int kq_gemm(int qtype, const float *x, int64_t M, int64_t K, const uint8_t *w, int64_t N, float *y) {
    if (qtype < Q5_1 || qtype > LAST_QTYPE || K % kq_block_elems(qtype) || M < 0 || N < 0) return -1;
#if defined(HYSPEC_AVX512) || defined(HYSPEC_AVX2)
    if (qtype != F32_ROWS && M > kq_few_max(qtype)) return kq_gemm_many(qtype, x, M, K, w, N, y);
#endif
    const int64_t rowbytes = K / kq_block_elems(qtype) * kq_block_bytes(qtype), nblocks = (N + 3) / 4;
#pragma omp parallel for schedule(static)
    for (int64_t nb = 0; nb < nblocks; nb++) {
#if defined(HYSPEC_AVX512) || defined(HYSPEC_AVX2)
        if (M == 1 && qtype != F32_ROWS) { /* decode: straight from the blocks, Q5_1 output rows in pairs */
            for (int64_t n = nb * 4; n < N && n < nb * 4 + 4; n += 2) {
                const uint8_t *wr = w + n * rowbytes;
                const int two = n + 1 < N && n + 1 < nb * 4 + 4;
                switch (qtype * 2 + two) { /* the K-quants in pairs ran out of registers: one by one, in order */
                    case Q5_1 * 2: kq_rows_dot(Q5_1, 1, x, K, wr, rowbytes, y + n); break;
                    case Q5_1 * 2 + 1: kq_rows_dot(Q5_1, 2, x, K, wr, rowbytes, y + n); break;
                    case Q4_K * 2: case Q4_K * 2 + 1:
                        for (int i = 0; i <= two; i++) kq_rows_dot(Q4_K, 1, x, K, wr + i * rowbytes, 0, y + n + i);
                        break;
                    case Q5_K * 2: case Q5_K * 2 + 1:
                        for (int i = 0; i <= two; i++) kq_rows_dot(Q5_K, 1, x, K, wr + i * rowbytes, 0, y + n + i);
                        break;
                    default:
                        for (int i = 0; i <= two; i++) kq_rows_dot(Q6_K, 1, x, K, wr + i * rowbytes, 0, y + n + i);
                        break;
                }
            }
            continue;
        }
        if (M >= 2 && qtype != F32_ROWS) { /* chunks of up to KQ_FEW_ROWS rows of x, each (type, count) compiled */
            for (int64_t m0 = 0; m0 < M; m0 += KQ_FEW_ROWS) {
                const int R = M - m0 < KQ_FEW_ROWS ? (int)(M - m0) : KQ_FEW_ROWS;
                const float *xr = x + m0 * K;
                for (int64_t n = nb * 4; n < N && n < nb * 4 + 4; n++) {
                    const uint8_t *wr = w + n * rowbytes;
                    float *yr = y + m0 * N + n;
#define KQ_FEW(T)                                                       \
    case T * 8 + 1: kq_rows_dot(T, 1, xr, K, wr, 0, yr); break;          \
    case T * 8 + 2: kq_few_dot(T, 2, xr, K, wr, yr, N); break;           \
    case T * 8 + 3: kq_few_dot(T, 3, xr, K, wr, yr, N); break;           \
    case T * 8 + 4: kq_few_dot(T, 4, xr, K, wr, yr, N); break;
                    switch (qtype * 8 + R) {
                        KQ_FEW(Q5_1)
                        KQ_FEW(Q4_K)
                        KQ_FEW(Q5_K)
                        KQ_FEW(Q6_K)
                    }
#undef KQ_FEW
                }
            }
            continue;
        }
#endif
        for (int64_t n = nb * 4; n < N && n < nb * 4 + 4; n++) {
            const uint8_t *wr = w + n * rowbytes;
            switch (qtype) { /* each type compiled on its own: no type branch in the inner loops */
                case Q5_1: kq_output_row(Q5_1, x, M, K, wr, y + n, N); break;
                case Q4_K: kq_output_row(Q4_K, x, M, K, wr, y + n, N); break;
                case Q5_K: kq_output_row(Q5_K, x, M, K, wr, y + n, N); break;
                case Q6_K: kq_output_row(Q6_K, x, M, K, wr, y + n, N); break;
                default: kq_output_row(F32_ROWS, x, M, K, wr, y + n, N); break;
            }
        }
    }
    return 0;
}
