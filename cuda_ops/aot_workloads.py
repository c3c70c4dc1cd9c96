"""The launches hyspec makes on a GPU, made on CPU tensors so ``aot.record_launches`` can note their variants.

Shapes: ``scripts/gpu_check.py``'s GPU plan (Llama-8B-like heads 32/8/128, contexts to 8k, trees to 64
nodes, vocabularies to 128k, its tuning sweep) and the serving paths of the default model (SmolLM2:
9/3 heads, D = 64, vocabulary 49152; decode at batch 1-64, chains, EAGLE trees, prefill chunks) in
every dtype the engine serves.  Kernels are not executed while recording (``execute=False``), so the
metadata is built directly and the caches are tiny: only shapes, dtypes and lengths decide a variant.
"""
from __future__ import annotations

import itertools

import torch

from hyspec.ops.attention import AttentionMetadata

#: (name, heads (Hq, Hkv, D), context lens, query lens, tree, block size, dtype)
ATTENTION = [
    *[(f"gpu_check {name}", (32, 8, 128), ctx, q, tree, bs, dt) for name, ctx, q, tree, bs, dt in [
        ("decode_bs1_ctx1k", [1024], [1], False, 16, torch.bfloat16),
        ("decode_bs1_ctx8k", [8192], [1], False, 16, torch.bfloat16),
        ("decode_bs8_ctx4k_page32", [4096] * 8, [1] * 8, False, 32, torch.bfloat16),
        ("decode_bs64_ctx8k", [8192] * 64, [1] * 64, False, 16, torch.bfloat16),
        ("chain_bs8_n8_ctx4k", [4096] * 8, [8] * 8, False, 16, torch.bfloat16),
        ("tree_bs1_n64_ctx8k", [8192], [64], True, 16, torch.bfloat16),
        ("tree_bs64_n64_ctx1k", [1024] * 64, [64] * 64, True, 16, torch.bfloat16),
        ("prefill_bs1_n2048", [0], [2048], False, 16, torch.bfloat16),
        ("decode_bs8_ctx2k_fp16", [2048] * 8, [1] * 8, False, 16, torch.float16),
        ("tree_bs4_n16_ctx1k_fp32", [1024] * 4, [16] * 4, True, 16, torch.float32),
    ]],
    *[(f"serve {name} {str(dt).removeprefix('torch.')}", (9, 3, 64), ctx, q, tree, 16, dt)
      for (name, ctx, q, tree), dt in itertools.product([
          ("decode_bs1", [300], [1], False), ("decode_bs64", [900] * 64, [1] * 64, False),
          ("chain_bs8_n5", [400] * 8, [5] * 8, False), ("eagle_tree_bs1_n16", [300], [16], True),
          ("eagle_tree_bs8_n64", [500] * 8, [64] * 8, True), ("prefill_chunk_1024", [0], [1024], False),
          ("mixed_prefill_decode", [0, 300, 700], [200, 1, 1], False)],
          [torch.bfloat16, torch.float16, torch.float32])],
]
#: sliding-window launches (the HAS_WINDOW variants): gpu_check's windowed cases and a windowed SmolLM2-shaped
#: decode, chain and prefill chunk, as (name, heads, context lens, query lens, tree, block size, dtype, window)
WINDOWED = [
    ("gpu_check decode_bs8_ctx8k_window1k", (32, 8, 128), [8192] * 8, [1] * 8, False, 16, torch.bfloat16, 1024),
    ("gpu_check tree_bs16_n16_ctx4k_window512", (32, 8, 128), [4096] * 16, [16] * 16, True, 16, torch.bfloat16, 512),
    ("gpu_check prefill_bs1_n4096_window1k", (32, 8, 128), [0], [4096], False, 16, torch.bfloat16, 1024),
    ("serve windowed decode_bs8", (9, 3, 64), [900] * 8, [1] * 8, False, 16, torch.bfloat16, 256),
    ("serve windowed chain_bs8_n5", (9, 3, 64), [400] * 8, [5] * 8, False, 16, torch.bfloat16, 256),
    ("serve windowed prefill_chunk_1024", (9, 3, 64), [0], [1024], False, 16, torch.bfloat16, 256),
]
#: gpu_check's tuning sweep (AttentionConfig overrides) on two of its cases
SWEEP = [dict(block_m=16), dict(block_m=64, num_warps=8), dict(block_n=64), dict(block_m=64, block_n=64, num_warps=8),
         dict(partition_size=256), dict(partition_size=1024)]
SWEEP_CASES = ("gpu_check decode_bs8_ctx4k_page32", "gpu_check tree_bs1_n64_ctx8k")
#: (tokens, Hq, Hkv, D, hidden) for the KV, norm and RoPE kernels
SMALL_OPS = [(64, 32, 8, 128, 4096), (4096, 32, 8, 128, 4096), (1, 9, 3, 64, 576), (1024, 9, 3, 64, 576)]
#: (sequences, nodes, vocab, stored q rows, tree): chains have one child per node (C = 1, which Triton
#: specialises), trees several
VERIFY = [(64, 64, 128256, False, True), (16, 16, 128256, True, True), (64, 8, 32000, True, False),
          (1, 16, 49152, False, False), (8, 64, 49152, True, True), (4, 8, 49152, False, True)]


def metadata(context_lens: list[int], query_lens: list[int], block_size: int, tree: bool) -> AttentionMetadata:
    seq_lens = [c + n for c, n in zip(context_lens, query_lens)]
    pages = max(-(-s // block_size) for s in seq_lens) + 1
    T = sum(query_lens)
    starts = [0, *itertools.accumulate(query_lens)]
    mask = torch.cat([torch.ones(n, max(query_lens), dtype=torch.bool).tril() for n in query_lens]) if tree else None
    return AttentionMetadata(
        query_start_loc=torch.tensor(starts, dtype=torch.int32), seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        block_tables=torch.zeros(len(seq_lens), pages, dtype=torch.int32),
        slot_mapping=torch.zeros(T, dtype=torch.int64), positions=torch.zeros(T, dtype=torch.int64),
        tree_mask=mask, query_lens=list(query_lens), seq_lens_host=seq_lens)


def launch_all() -> None:
    """Every wrapper, every shape above (inside ``record_launches(execute=False)``)."""
    from hyspec.cuda_ops.attention import AttentionConfig, default_attention_config, triton_paged_attention
    from hyspec.cuda_ops.kv import triton_compact_kv, triton_write_kv
    from hyspec.cuda_ops.norm import triton_rms_norm
    from hyspec.cuda_ops.rotary import triton_rotary
    from hyspec.cuda_ops.verify import triton_rejection_sample
    from hyspec.seam.tree import TreeBatch

    for name, (hq, hkv, d), ctx, qlens, tree, bs, dtype in ATTENTION:
        meta = metadata(ctx, qlens, bs, tree)
        q = torch.empty(sum(qlens), hq, d, dtype=dtype)
        cache = torch.empty(2, bs, hkv, d, dtype=dtype)
        triton_paged_attention(q, cache, cache, meta, d ** -0.5)
        if name in SWEEP_CASES:
            base = default_attention_config(d)
            for overrides in SWEEP:
                config = AttentionConfig(**{**base.__dict__, **overrides})
                triton_paged_attention(q, cache, cache, meta, d ** -0.5, config=config)
    for _name, (hq, hkv, d), ctx, qlens, tree, bs, dtype, window in WINDOWED:
        q = torch.empty(sum(qlens), hq, d, dtype=dtype)
        cache = torch.empty(2, bs, hkv, d, dtype=dtype)
        triton_paged_attention(q, cache, cache, metadata(ctx, qlens, bs, tree), d ** -0.5, sliding_window=window)
    for (tokens, hq, hkv, d, hidden), dtype in itertools.product(SMALL_OPS, [torch.bfloat16, torch.float16,
                                                                            torch.float32]):
        pool = torch.empty(tokens // 16 + 8, 16, hkv, d, dtype=dtype)
        slots = torch.arange(tokens)
        triton_write_kv(torch.empty(tokens, hkv, d), torch.empty(tokens, hkv, d), pool, pool, slots)  # fp32 in
        triton_write_kv(torch.empty(tokens, hkv, d, dtype=dtype), torch.empty(tokens, hkv, d, dtype=dtype),
                        pool, pool, slots)
        triton_compact_kv(pool, pool, slots, slots.roll(1))
        x, w = torch.empty(tokens, hidden, dtype=dtype), torch.empty(hidden, dtype=dtype)
        triton_rms_norm(x, w, 1e-6)
        triton_rms_norm(x, w, 1e-6, torch.empty_like(x))
        triton_rotary(torch.empty(tokens, hq, d, dtype=dtype), torch.empty(tokens, hkv, d, dtype=dtype),
                      torch.zeros(tokens, dtype=torch.int64), torch.empty(8192, d))
    for batch, nodes, vocab, sampled, tree in VERIFY:
        parents = torch.full((batch, nodes), -1, dtype=torch.int64)
        parents[:, 1:] = torch.arange(1, nodes) // 2 if tree else torch.arange(nodes - 1)  # binary tree or chain
        q = torch.empty(batch, nodes, vocab) if sampled else None
        trees = TreeBatch(torch.zeros(batch, nodes, dtype=torch.int64), parents, torch.full((batch,), nodes), q,
                          vocab)
        triton_rejection_sample(torch.empty(batch * nodes, vocab), trees, torch.zeros(batch, nodes,
                                                                                      dtype=torch.float64))


__all__ = ["ATTENTION", "SMALL_OPS", "VERIFY", "WINDOWED", "launch_all", "metadata"]
