"""Inputs for every op of the op table, as the engine builds them: ragged batches, trees, page boundaries, GQA.

Each :class:`OpCase` makes fresh inputs on any device from one seeded CPU
master copy, so the reference (on the CPU) and the backend (on its device)
see bit-identical inputs, and says which tensors of the outcome to compare
(the caches for the in-place KV ops, the ids for the sampling ops).
Paged-attention inputs come from ``hyspec.cuda_ops.cases`` (pure torch), the
same builder the Triton kernel tests and the GPU check use.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import torch

from hyspec.cuda_ops.cases import PagedCase, paged_attention_case
from hyspec.ops.attention import AttentionMetadata
from hyspec.ops.sampling import SamplingTensors
from hyspec.seam.tree import TreeBatch

FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
HEADS = {"mha": (4, 4), "gqa2": (4, 2), "gqa4": (8, 2)}

#: name -> (context lengths, query lengths, block size, tree?)
ATTENTION_SCENARIOS = {
    "decode": ([70, 40, 5], [1, 1, 1], 16, False),  # ragged contexts, the first past several pages
    "prefill": ([0, 13], [33, 20], 16, False),  # a cold prefill and a chunk, both crossing page boundaries
    "ragged": ([0, 30, 7, 64], [9, 1, 4, 2], 32, False),  # prefill, decode and short chains in one batch
    "tree": ([20, 70, 0], [8, 1, 13], 16, True),  # random draft trees (ancestor masks, depth positions)
}
#: Shapes of the Ascend paths (docs/npu.md): FIA PageAttention takes 128-token blocks when more than one query
#: row attends; the default model (SmolLM2: 9 query / 3 KV heads, D = 64) runs BSND with an explicit mask,
#: D = 128 causal steps run TND.  name -> (context lengths, query lengths, heads, head dim, block size, tree?)
NPU_SHAPED_SCENARIOS = {
    "smollm2 prefill": ([0, 150], [40, 3], (9, 3), 64, 128, False),
    "smollm2 tree": ([20, 170], [8, 13], (9, 3), 64, 128, True),
    "d128 chain": ([0, 140], [33, 4], (8, 2), 128, 128, False),
}


@dataclass(frozen=True)
class OpCase:
    op: str
    label: str
    dtype: torch.dtype
    make: Callable[[torch.device], tuple[Any, ...]]  # fresh positional arguments on a device
    outcome: Callable[[Any, tuple[Any, ...]], list[torch.Tensor]]  # (return value, arguments) -> compared tensors


# -- attention ---------------------------------------------------------------------------------------------

def paged_case_to(case: PagedCase, device: torch.device) -> tuple[Any, ...]:
    pool = case.pool.to(device, copy=True)
    layer = 1  # paged_attention_case's default: the views are strided, as in the engine's pool
    m = case.meta
    meta = AttentionMetadata(
        query_start_loc=m.query_start_loc.to(device), seq_lens=m.seq_lens.to(device),
        block_tables=m.block_tables.to(device), slot_mapping=m.slot_mapping.to(device),
        positions=m.positions.to(device), tree_mask=None if m.tree_mask is None else m.tree_mask.to(device),
        query_lens=list(m.query_lens), seq_lens_host=list(m.seq_lens_host))
    return case.q.to(device, copy=True), pool[:, layer, 0], pool[:, layer, 1], meta, case.scale


def attention_cases(quick: bool) -> list[OpCase]:
    out = []
    combos = [(s, h, d) for s in ATTENTION_SCENARIOS for h in HEADS for d in FLOAT_DTYPES]
    if quick:  # every scenario, every GQA ratio and every dtype at least once
        heads, dtypes = list(HEADS), list(FLOAT_DTYPES)
        combos = [(s, heads[i % 3], dtypes[i % 3]) for i, s in enumerate(ATTENTION_SCENARIOS)]
        combos.append(("tree", "gqa4", torch.bfloat16))
    for i, (scenario, heads_name, dtype) in enumerate(combos):
        ctx, qlens, block_size, tree = ATTENTION_SCENARIOS[scenario]
        master = paged_attention_case(ctx, qlens, *HEADS[heads_name], 32, block_size, dtype, tree=tree, seed=i)
        out.append(OpCase("attention", f"{scenario} {heads_name} block {block_size}", dtype,
                          lambda dev, c=master: paged_case_to(c, dev), lambda ret, args: [ret]))
    for j, (name, (ctx, qlens, heads, head_dim, block_size, tree)) in enumerate(NPU_SHAPED_SCENARIOS.items()):
        for dtype in ((torch.bfloat16,) if quick else (torch.bfloat16, torch.float16)):
            master = paged_attention_case(ctx, qlens, *heads, head_dim, block_size, dtype, tree=tree, seed=50 + j)
            out.append(OpCase("attention", f"{name} D={head_dim} block {block_size}", dtype,
                              lambda dev, c=master: paged_case_to(c, dev), lambda ret, args: [ret]))
    return out


# -- KV writes and compaction --------------------------------------------------------------------------------

def _pool(gen: torch.Generator, num_blocks: int, block_size: int, kv_heads: int, head_dim: int,
          dtype: torch.dtype) -> torch.Tensor:  # [num_blocks, 2 layers, 2, block_size, Hkv, D]
    return torch.randn(num_blocks, 2, 2, block_size, kv_heads, head_dim, generator=gen).to(dtype)


def write_kv_cases(quick: bool) -> list[OpCase]:
    out = []
    dtypes = FLOAT_DTYPES
    for dtype in dtypes:
        for tokens, block_size, cast in ((1, 16, False), (37, 16, False), (9, 32, dtype != torch.float32)):
            if quick and tokens == 9 and dtype == torch.float16:
                continue
            gen = torch.Generator().manual_seed(tokens * 7 + block_size)
            num_blocks = 6
            pool = _pool(gen, num_blocks, block_size, 2, 32, dtype)
            src_dtype = torch.float32 if cast else dtype
            k = torch.randn(tokens, 2, 32, generator=gen).to(src_dtype)
            v = torch.randn(tokens, 2, 32, generator=gen).to(src_dtype)
            slots = torch.randperm(num_blocks * block_size, generator=gen)[:tokens]

            def make(dev, pool=pool, k=k, v=v, slots=slots):
                p = pool.to(dev, copy=True)
                return k.to(dev), v.to(dev), p[:, 1, 0], p[:, 1, 1], slots.to(dev)

            label = f"{tokens} tokens block {block_size}" + (" fp32 -> cache dtype" if cast else "")
            out.append(OpCase("write_kv", label, dtype, make, lambda ret, args: [args[2], args[3]]))
    return out


def compact_kv_cases(quick: bool) -> list[OpCase]:
    """Accepted tree paths moved into place: sources at or after their destinations, overlapping, across pages."""
    out = []
    for dtype in FLOAT_DTYPES:
        for context, nodes, path, block_size in ((14, 9, [0, 2, 3, 7], 16), (30, 6, [0, 1, 2], 16),
                                                   (5, 12, [0, 4, 9, 11], 8)):
            gen = torch.Generator().manual_seed(context + nodes)
            pages = math.ceil((context + nodes) / block_size)
            num_blocks = pages + 3
            table = torch.randperm(num_blocks, generator=gen)[:pages]
            pool = _pool(gen, num_blocks, block_size, 2, 32, dtype)

            def slot(j: int, table=table, block_size=block_size) -> int:
                return int(table[j // block_size]) * block_size + j % block_size

            src = torch.tensor([slot(context + n) for n in path], dtype=torch.int64)
            dst = torch.tensor([slot(context + d) for d in range(len(path))], dtype=torch.int64)

            def make(dev, pool=pool, src=src, dst=dst):
                p = pool.to(dev, copy=True)
                return p[:, 0, 0], p[:, 0, 1], src.to(dev), dst.to(dev)

            out.append(OpCase("compact_kv", f"context {context}, path {path} of {nodes} nodes, block {block_size}",
                              dtype, make, lambda ret, args: [args[0], args[1]]))
        if quick and dtype == torch.bfloat16:
            break
    return out


# -- RMSNorm and RoPE ----------------------------------------------------------------------------------------

def rms_norm_cases(quick: bool) -> list[OpCase]:
    out = []
    for dtype in FLOAT_DTYPES:
        for shape, residual in (((7, 256), False), ((5, 256), True), ((6, 4, 32), False)):
            gen = torch.Generator().manual_seed(sum(shape))
            x = (torch.randn(*shape, generator=gen) * 2).to(dtype)
            w = (1 + 0.1 * torch.randn(shape[-1], generator=gen)).to(dtype)
            r = torch.randn(*shape, generator=gen).to(dtype) if residual else None

            def make(dev, x=x, w=w, r=r):
                return (x.to(dev), w.to(dev), 1e-5) + ((r.to(dev),) if r is not None else ())

            label = f"{list(shape)}" + (" + residual" if residual else "") + (" per head" if len(shape) == 3 else "")
            out.append(OpCase("rms_norm", label, dtype, make,
                              lambda ret, args: list(ret) if isinstance(ret, tuple) else [ret]))
    return out


def rope_table(head_dim: int, max_positions: int, theta: float = 10000.0) -> torch.Tensor:  # [P, D] fp32
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    freqs = torch.arange(max_positions, dtype=torch.float32)[:, None] * inv_freq[None, :]
    return torch.cat([freqs.cos(), freqs.sin()], dim=-1)


def rotary_cases(quick: bool) -> list[OpCase]:
    out = []
    for dtype in FLOAT_DTYPES:
        for tokens, heads, head_dim in ((9, (4, 2), 64), (5, (8, 2), 128), (3, (4, 4), 32)):
            gen = torch.Generator().manual_seed(tokens * head_dim)
            q = torch.randn(tokens, heads[0], head_dim, generator=gen).to(dtype)
            k = torch.randn(tokens, heads[1], head_dim, generator=gen).to(dtype)
            positions = torch.randint(0, 2048, (tokens,), generator=gen)
            cache = rope_table(head_dim, 2048)

            def make(dev, q=q, k=k, positions=positions, cache=cache):
                return q.to(dev), k.to(dev), positions.to(dev), cache.to(dev)

            out.append(OpCase("rotary", f"{tokens} tokens, heads {heads[0]}/{heads[1]}, head_dim {head_dim}", dtype,
                              make, lambda ret, args: list(ret)))
        if quick and dtype == torch.bfloat16:
            break
    return out


# -- the lm-head matmul ----------------------------------------------------------------------------------------

def logits_cases(quick: bool) -> list[OpCase]:
    """Decode rows, a verification batch and ``[B, K, H]`` draft blocks against one lm_head (hidden 256)."""
    out = []
    dtypes = FLOAT_DTYPES[:2] if quick else FLOAT_DTYPES
    for dtype in dtypes:
        for shape, vocab in (((1, 256), 300), ((7, 256), 300), ((2, 4, 256), 1000)):
            gen = torch.Generator().manual_seed(sum(shape) + vocab)
            hidden = torch.randn(*shape, generator=gen).to(dtype)  # after the final RMSNorm: unit scale
            weight = (0.05 * torch.randn(vocab, shape[-1], generator=gen)).to(dtype)  # [V, H]

            def make(dev, hidden=hidden, weight=weight):
                return hidden.to(dev, copy=True), weight.to(dev, copy=True)

            out.append(OpCase("logits", f"hidden {list(shape)}, vocab {vocab}", dtype, make,
                              lambda ret, args: [ret]))
    return out


# -- sampling ------------------------------------------------------------------------------------------------

def _sampling(rows: int) -> SamplingTensors:
    """Greedy, plain temperature, top-k, top-p and min-p rows, cycled."""
    presets = [(0.0, None, None, None), (0.7, None, None, None), (1.0, 5, None, None), (0.9, None, 0.9, None),
               (1.3, 40, 0.95, 0.05)]
    picked = [presets[r % len(presets)] for r in range(rows)]
    return SamplingTensors.from_lists(*[[p[i] for p in picked] for i in range(4)])


def sample_cases(quick: bool) -> list[OpCase]:
    out = []
    for rows, vocab in ((10, 50), (5, 1000)):
        gen = torch.Generator().manual_seed(rows * vocab)
        probs = _sampling(rows).process(torch.randn(rows, vocab, generator=gen) * 3)  # [N, V] fp32
        uniforms = torch.rand(rows, generator=gen, dtype=torch.float64)

        def make(dev, probs=probs, uniforms=uniforms):
            return probs.to(dev), None, uniforms.to(dev)

        out.append(OpCase("sample", f"{rows} rows, vocab {vocab}, mixed sampling parameters", torch.float32, make,
                          lambda ret, args: [ret]))
    return out


def _random_trees(gen: torch.Generator, sizes: list[int], vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Padded ``tokens`` and ``parents`` ``[B, N]`` of random trees (node i's parent uniform over 0..i-1)."""
    n = max(sizes)
    tokens = torch.randint(0, vocab, (len(sizes), n), generator=gen)
    parents = torch.full((len(sizes), n), -1, dtype=torch.int64)
    for b, size in enumerate(sizes):
        for i in range(1, size):
            parents[b, i] = int(torch.randint(0, i, (1,), generator=gen))
    return tokens, parents


def rejection_sample_cases(quick: bool) -> list[OpCase]:
    out = []
    for sizes, vocab, sampled in (([4, 1, 7, 3], 32, True), ([6, 6, 2], 64, False), ([9, 5], 16, True)):
        gen = torch.Generator().manual_seed(sum(sizes) * vocab)
        tokens, parents = _random_trees(gen, sizes, vocab)
        num_nodes = torch.tensor(sizes)
        rows = sum(sizes)
        sampling = SamplingTensors.from_lists([0.8] * rows, [10] * rows, [0.95] * rows)
        target = sampling.process(torch.randn(rows, vocab, generator=gen) * 2)  # [T, V] p after every node
        q = None
        if sampled:  # draft tokens drawn from q: store the q rows they came from
            q = SamplingTensors.from_lists([1.0] * len(sizes) * max(sizes)).process(
                torch.randn(len(sizes) * max(sizes), vocab, generator=gen) * 2).view(len(sizes), max(sizes), vocab)
            for b in range(len(sizes)):
                for i in range(1, sizes[b]):
                    tokens[b, i] = int(torch.multinomial(q[b, i], 1, generator=gen))
        uniforms = torch.rand(len(sizes), max(sizes), generator=gen, dtype=torch.float64)

        def make(dev, tokens=tokens, parents=parents, num_nodes=num_nodes, q=q, target=target, u=uniforms, v=vocab):
            trees = TreeBatch(tokens.to(dev), parents.to(dev), num_nodes.to(dev), None if q is None else q.to(dev), v)
            return target.to(dev), trees, u.to(dev)

        kind = "drafts sampled from q" if sampled else "deterministic drafts"
        out.append(OpCase("rejection_sample", f"trees {sizes}, vocab {vocab}, {kind}", torch.float32, make,
                          lambda ret, args: list(ret)))
    return out


BUILDERS: dict[str, Callable[[bool], list[OpCase]]] = {
    "attention": attention_cases, "write_kv": write_kv_cases, "compact_kv": compact_kv_cases,
    "rms_norm": rms_norm_cases, "rotary": rotary_cases, "logits": logits_cases, "sample": sample_cases,
    "rejection_sample": rejection_sample_cases,
}


def op_cases(op: str, quick: bool) -> list[OpCase]:
    return BUILDERS[op](quick)


__all__ = ["ATTENTION_SCENARIOS", "BUILDERS", "OpCase", "op_cases", "rope_table"]
