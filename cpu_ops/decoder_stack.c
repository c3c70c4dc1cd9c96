/*
 * A run of decoder layers of a Llama-family model in one call: the CPU backend's answer to a decode step
 * that spent more time between kernels than in them.
 *
 * Per layer, for T packed token rows (prefill chunks, decode rows and tree-verification rows alike):
 *   x = h + residual (the first layer of a forward: x = h); residual = x; h = rms_norm(x) * w_in
 *   qkv = h W_qkv^T (+ b);  q, k rotated by their positions (NeoX halves);  k, v written to their slots
 *   a = paged_attention(q, caches);  h = a W_o^T (+ b)
 *   x = h + residual; residual = x; h = rms_norm(x) * w_post
 *   g, u = h W_gu^T (+ b);  h = (silu(g) * u) W_down^T (+ b)
 * which is hyspec.model.llama's DecoderLayer over the op table, with the projections in llama.cpp's
 * blocks (qgemm.c, included) and the attention of paged_attention.c (included): the same kernels the
 * layer-by-layer path calls, without ~400 trips through Python and torch's dispatcher per step.
 *
 * Every row is computed alone (norms, RoPE, SiLU row by row; qgemm and the attention are row-independent
 * by construction), so a token's hidden state is the same whether it is decoded alone, verified among
 * drafts or part of a batch: plain decoding and speculative verification agree bit for bit.
 *
 * Activations stay fp32 inside the stack.  Dense projections (fp32 or bf16 weights) go through
 * hyspec_dense_gemm (dense_gemm.c, batch-invariant; passed in as a function pointer, its own library):
 * for bf16 the normed input is rounded to bf16 and the output widened back, as a bf16 linear layer does.
 * Caches are fp32 or bf16 (keys and values rounded once when written; the attention of paged_attention.c
 * in its bf16 mode).  The caller (hyspec.cpu_ops.decoder_stack) checks the model qualifies and keeps the
 * layer-by-layer path for everything else.
 */
#include "qgemm.c"
#include "qgemm_a8.c"
#include "paged_attention.c"

#include <math.h>

int hyspec_decoder_stack_version(void) { return 5; }

/* Entries per layer in the layer table (int64): the four projections' weight pointers, their types (a GGML
 * block type, or DENSE_F32 / DENSE_BF16), their bias pointers (0: none; fp32 for blocks, the weight's dtype
 * for dense weights), the two norm weights (fp32). */
enum { W_QKV = 0, W_O, W_GU, W_DOWN, T_QKV = 4, B_QKV = 8, N_IN = 12, N_POST, LAYER_ENTRIES };
enum { DENSE_F32 = 16, DENSE_BF16 = 17 };
enum { A8_TYPES = 32 }; /* A8_TYPES + a GGML block type: that matrix in qgemm_a8's layout, 8-bit activations */
/* PARTS: row ranges stored in different block types (a Q4_K_M file's Q4_K q/k beside a Q6_K v); the weight
 * pointer is an int64 descriptor: the count, then each part's block type (A8_TYPES + it for a part in qgemm_a8's
 * layout), blocks address and rows */
enum { PARTS = 48 };

/* hyspec_dense_gemm's signature (dense_gemm.c): dtype 0 fp32 / 1 bf16, x, M, K, w, N, bias, y */
typedef int (*dense_gemm_fn)(int, const void *, int64_t, int64_t, const void *, int64_t, const void *, void *);

static void add_bias(float *y, const float *b, int64_t T, int64_t N);

/* y [M, N] fp32 = x [M, K] fp32 times the weight of the given type; xb, yb: bf16 scratch of M * max(K, N) */
static int linear(int type, const float *x, int64_t M, int64_t K, const void *w, const void *bias, int64_t N,
                  float *y, uint16_t *xb, uint16_t *yb, dense_gemm_fn dense) {
    if (type >= Q4_0 && type <= LAST_QTYPE) { /* Q4_0 .. Q5_0 (qgemm.c), Q5_1 .. Q6_K (kquants.c) */
        const int rc = hyspec_qgemm(type, x, M, K, (const uint8_t *)w, N, y);
        if (rc == 0) add_bias(y, (const float *)bias, M, N);
        return rc;
    }
    if (type == PARTS) { /* each part into scratch, then into its columns of y */
        const int64_t *d = (const int64_t *)w, parts = d[0];
        int64_t most = 0, col = 0;
        for (int64_t p = 0; p < parts; p++) most = d[3 + 3 * p] > most ? d[3 + 3 * p] : most;
        float *part_y = malloc(sizeof(float) * (size_t)(M * most + 1));
        if (!part_y) return -2;
        int rc = 0;
        for (int64_t p = 0; p < parts && rc == 0; p++) {
            const int64_t rows = d[3 + 3 * p];
            const int pt = (int)d[1 + 3 * p]; /* a block type, or A8_TYPES + one: that part in qgemm_a8's layout */
            const uint8_t *pw = (const uint8_t *)(intptr_t)d[2 + 3 * p];
            rc = pt >= A8_TYPES ? (a8_supported(pt - A8_TYPES) ? hyspec_qgemm_a8(pt - A8_TYPES, x, M, K, pw, rows, part_y) : -1)
                                : hyspec_qgemm(pt, x, M, K, pw, rows, part_y);
            for (int64_t m = 0; rc == 0 && m < M; m++) memcpy(y + m * N + col, part_y + m * rows, sizeof(float) * rows);
            col += rows;
        }
        free(part_y);
        if (rc == 0 && col != N) rc = -1;
        if (rc == 0) add_bias(y, (const float *)bias, M, N);
        return rc;
    }
    if (type >= A8_TYPES && a8_supported(type - A8_TYPES)) { /* Q4_0 / Q4_1 / Q8_0 / Q5_0 / Q4_K */
        const int rc = hyspec_qgemm_a8(type - A8_TYPES, x, M, K, (const uint8_t *)w, N, y);
        if (rc == 0) add_bias(y, (const float *)bias, M, N);
        return rc;
    }
    if (!dense) return -1;
    if (type == DENSE_F32) return dense(0, x, M, K, w, N, bias, y);
    if (type != DENSE_BF16) return -1;
    for (int64_t i = 0; i < M * K; i++) xb[i] = f32_to_bf16(x[i]);
    const int rc = dense(1, xb, M, K, w, N, bias, yb);
    for (int64_t i = 0; rc == 0 && i < M * N; i++) y[i] = bf16_to_f32(yb[i]);
    return rc;
}

/* y[r] = rms_norm(x[r]) * w, in the reference's order: x * rsqrt(mean(x^2) + eps), then times the weight */
static void rms_norm_rows(const float *x, const float *w, float *y, int64_t T, int64_t H, float eps) {
#pragma omp parallel for schedule(static) if (T >= 8)
    for (int64_t t = 0; t < T; t++) {
        const float *xr = x + t * H;
        float *yr = y + t * H;
        float ss = 0.0f;
        for (int64_t i = 0; i < H; i++) ss += xr[i] * xr[i];
        const float r = 1.0f / sqrtf(ss / (float)H + eps);
        for (int64_t i = 0; i < H; i++) yr[i] = w[i] * (xr[i] * r);
    }
}

/* rotate heads [T, nh, D] in place by cos_sin [*, D] (cos in the first half, sin in the second) */
static void rotate(float *x, int64_t T, int64_t nh, int64_t stride_t, int64_t D, const int64_t *positions,
                   const float *cos_sin) {
    const int64_t half = D / 2;
    for (int64_t t = 0; t < T; t++) {
        const float *cs = cos_sin + positions[t] * D;
        for (int64_t h = 0; h < nh; h++) {
            float *v = x + t * stride_t + h * D;
            for (int64_t i = 0; i < half; i++) {
                const float a = v[i], b = v[i + half], c = cs[i], s = cs[half + i];
                v[i] = a * c - b * s;
                v[i + half] = b * c + a * s;
            }
        }
    }
}

static void add_bias(float *y, const float *b, int64_t T, int64_t N) {
    if (!b) return;
    for (int64_t t = 0; t < T; t++)
        for (int64_t n = 0; n < N; n++) y[t * N + n] += b[n];
}

/* layers [first, last) of the table (LAYER_ENTRIES int64 per layer); kv[2 l], kv[2 l + 1]: layer l's fp32
 * key and value caches, element (block, offset, head, d) at block * sb + offset * so + head * sh + d.
 * h, residual: [T, H] fp32, updated in place (has_residual = 0: the stack starts the residual stream).
 * positions, slot_mapping: [T] int64; cos_sin: [*, D] fp32; the attention arguments are
 * hyspec_paged_attention's.  aux_layers [n_aux]: layers whose output hidden state (h + residual, fp32) is
 * written to aux_out [n_aux, T, H] (EAGLE-3's features) in the same call: the alternative, one call per
 * segment between aux layers, cost a decode step of SmolLM2 12 % (three extra calls and their Python).
 * Returns 0, -1 on bad arguments, -2 when out of memory. */
int hyspec_decoder_stack(const int64_t *table, int64_t first, int64_t last, const int64_t *kv, int64_t T,
                         int64_t H, int64_t Hq, int64_t Hkv, int64_t D, int64_t I, float eps, float *h,
                         float *residual, int has_residual, const int64_t *positions, const float *cos_sin,
                         const int64_t *slot_mapping, int64_t sb, int64_t so, int64_t sh, int64_t block_size,
                         const int32_t *block_tables, int64_t bt_stride, const int32_t *seq_lens,
                         const int32_t *query_lens, const int32_t *row_seq, const int32_t *row_i,
                         const uint8_t *tree_mask, int64_t max_q, float scale, int kv_bf16, void *dense_gemm,
                         const int64_t *aux_layers, int64_t n_aux, float *aux_out) {
    if (T < 1 || H % 32 || (Hq * D) % 32 || I % 32 || D % 8 || Hq % Hkv || first < 0 || last < first) return -1;
    const int64_t nq = Hq * D, nkv = Hkv * D, nqkv = nq + 2 * nkv;
    float *normed = malloc(sizeof(float) * (size_t)(T * H));
    float *qkv = malloc(sizeof(float) * (size_t)(T * nqkv));
    float *q = malloc(sizeof(float) * (size_t)(T * nq));
    float *attn = malloc(sizeof(float) * (size_t)(T * nq));
    float *gu = malloc(sizeof(float) * (size_t)(T * 2 * I));
    float *act = malloc(sizeof(float) * (size_t)(T * I));
    /* bf16 scratch: inputs and outputs of bf16 linears (the widest is gate_up's 2 I), q and the attention */
    const int64_t wide = (2 * I > nqkv ? 2 * I : nqkv) > H ? (2 * I > nqkv ? 2 * I : nqkv) : H;
    uint16_t *xb = malloc(sizeof(uint16_t) * (size_t)(T * wide)), *yb = malloc(sizeof(uint16_t) * (size_t)(T * wide));
    int rc = (normed && qkv && q && attn && gu && act && xb && yb) ? 0 : -2;
    const dense_gemm_fn dense = (dense_gemm_fn)dense_gemm;
    for (int64_t l = first; l < last && rc == 0; l++) {
        const int64_t *e = table + l * LAYER_ENTRIES;
        const void *w[4], *bias[4];
        int qt[4];
        for (int j = 0; j < 4; j++) {
            w[j] = (const void *)(intptr_t)e[W_QKV + j];
            qt[j] = (int)e[T_QKV + j];
            bias[j] = (const void *)(intptr_t)e[B_QKV + j];
        }
        /* input norm, with the residual added first after the stack's first layer */
        if (has_residual) {
            for (int64_t i = 0; i < T * H; i++) residual[i] += h[i];
        } else {
            memcpy(residual, h, sizeof(float) * (size_t)(T * H));
            has_residual = 1;
        }
        rms_norm_rows(residual, (const float *)(intptr_t)e[N_IN], normed, T, H, eps);
        if ((rc = linear(qt[0], normed, T, H, w[0], bias[0], nqkv, qkv, xb, yb, dense))) break;
        rotate(qkv, T, Hq, nqkv, D, positions, cos_sin);       /* q heads */
        rotate(qkv + nq, T, Hkv, nqkv, D, positions, cos_sin); /* k heads */
        void *kc = (void *)(intptr_t)kv[2 * l], *vc = (void *)(intptr_t)kv[2 * l + 1];
        for (int64_t t = 0; t < T; t++) {
            const int64_t slot = slot_mapping[t], at = (slot / block_size) * sb + (slot % block_size) * so;
            for (int64_t g = 0; g < Hkv; g++) {
                const float *kr = qkv + t * nqkv + nq + g * D, *vr = kr + nkv;
                if (kv_bf16) {
                    uint16_t *kd = (uint16_t *)kc + at + g * sh, *vd = (uint16_t *)vc + at + g * sh;
                    for (int64_t d = 0; d < D; d++) {
                        kd[d] = f32_to_bf16(kr[d]);
                        vd[d] = f32_to_bf16(vr[d]);
                    }
                } else {
                    memcpy((float *)kc + at + g * sh, kr, sizeof(float) * (size_t)D);
                    memcpy((float *)vc + at + g * sh, vr, sizeof(float) * (size_t)D);
                }
            }
            if (kv_bf16)
                for (int64_t i = 0; i < nq; i++) xb[t * nq + i] = f32_to_bf16(qkv[t * nqkv + i]);
            else
                memcpy(q + t * nq, qkv + t * nqkv, sizeof(float) * (size_t)nq);
        }
        /* bf16 caches: q rounded to bf16 (in xb), the attention's bf16 output (in yb) widened */
        if ((rc = hyspec_paged_attention(kv_bf16 ? (const void *)xb : (const void *)q, T, Hq, D, kc, vc, sb, so, sh,
                                         block_size, Hkv, block_tables, bt_stride, seq_lens, query_lens, row_seq,
                                         row_i, tree_mask, max_q, scale, kv_bf16 ? (void *)yb : (void *)attn,
                                         kv_bf16)))
            break;
        if (kv_bf16)
            for (int64_t i = 0; i < T * nq; i++) attn[i] = bf16_to_f32(yb[i]);
        if ((rc = linear(qt[1], attn, T, nq, w[1], bias[1], H, h, xb, yb, dense))) break;
        /* post-attention norm */
        for (int64_t i = 0; i < T * H; i++) residual[i] += h[i];
        rms_norm_rows(residual, (const float *)(intptr_t)e[N_POST], normed, T, H, eps);
        if ((rc = linear(qt[2], normed, T, H, w[2], bias[2], 2 * I, gu, xb, yb, dense))) break;
        for (int64_t t = 0; t < T; t++) { /* silu(g) * u = g / (1 + exp(-g)) * u, the exps a row at a time */
            float *a = act + t * I;
            const float *g = gu + t * 2 * I, *u = g + I;
            for (int64_t i = 0; i < I; i++) a[i] = -g[i];
            vexp_array(a, a, I);
            for (int64_t i = 0; i < I; i++) a[i] = g[i] / (1.0f + a[i]) * u[i];
        }
        if ((rc = linear(qt[3], act, T, I, w[3], bias[3], H, h, xb, yb, dense))) break;
        for (int64_t j = 0; j < n_aux; j++)
            if (aux_layers[j] == l) {
                float *o = aux_out + j * T * H;
                for (int64_t i = 0; i < T * H; i++) o[i] = h[i] + residual[i];
            }
    }
    free(normed);
    free(qkv);
    free(q);
    free(attn);
    free(gu);
    free(act);
    free(xb);
    free(yb);
    return rc;
}
