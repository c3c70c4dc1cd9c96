"""Random paged-attention inputs as the engine builds them, for kernel tests and the GPU check.

The KV lives in one block-major pool ``[num_blocks, num_layers, 2, block_size,
Hkv, D]``; a layer's caches are the strided views ``pool[:, layer, 0]`` and
``pool[:, layer, 1]`` (block stride larger than ``block_size * Hkv * D``).
Pages are handed out in a shuffled order so block tables are scattered.
Needs only torch.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from hyspec.ops.attention import AttentionMetadata


@dataclass(frozen=True)
class PagedCase:
    q: torch.Tensor  # [T, Hq, D]
    pool: torch.Tensor  # [num_blocks, num_layers, 2, block_size, Hkv, D]
    k_cache: torch.Tensor  # [num_blocks, block_size, Hkv, D], a strided view of pool
    v_cache: torch.Tensor  # [num_blocks, block_size, Hkv, D], a strided view of pool
    meta: AttentionMetadata
    scale: float

    def args(self) -> tuple:
        """Positional arguments of ``OpTable.attention``."""
        return self.q, self.k_cache, self.v_cache, self.meta, self.scale


def random_tree(num_nodes: int, generator: torch.Generator) -> tuple[torch.Tensor, list[int]]:
    """A random draft forest in topological order: ``(ancestor-or-self mask [n, n] bool, depths)``.

    Node ``k``'s parent is uniform over ``-1`` (hangs off the context) and the
    nodes before it, so chains, bushes and several roots all occur.
    """
    mask = torch.zeros(num_nodes, num_nodes, dtype=torch.bool)
    depths: list[int] = []
    for k in range(num_nodes):
        parent = int(torch.randint(-1, k, (1,), generator=generator)) if k else -1
        if parent >= 0:
            mask[k] = mask[parent]
        mask[k, k] = True
        depths.append(int(mask[k].sum()) - 1)
    return mask, depths


def paged_attention_case(
    context_lens: list[int],
    query_lens: list[int],
    num_q_heads: int,
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
    dtype: torch.dtype,
    *,
    tree: bool = False,
    device: torch.device | str = "cpu",
    seed: int = 0,
    num_layers: int = 2,
    layer: int = 1,
    spare_blocks: int = 3,
) -> PagedCase:
    """A step where sequence ``b`` has ``context_lens[b]`` committed and ``query_lens[b]`` new tokens.

    The new tokens' KV is already in the pool (random, like everything else);
    with ``tree`` each sequence's new tokens form a random draft tree with
    positions ``context + depth``.
    """
    if len(context_lens) != len(query_lens) or not query_lens:
        raise ValueError("context_lens and query_lens must be non-empty and of equal length")
    gen = torch.Generator().manual_seed(seed)
    seq_lens = [c + n for c, n in zip(context_lens, query_lens)]
    pages = [math.ceil(length / block_size) for length in seq_lens]
    num_blocks = sum(pages) + spare_blocks
    order = torch.randperm(num_blocks, generator=gen)
    width = max(pages) + 1  # one padding column, as the engine's tables have
    block_tables = torch.zeros(len(seq_lens), width, dtype=torch.int32)
    first = 0
    for b, count in enumerate(pages):
        block_tables[b, :count] = order[first:first + count]
        first += count

    max_q = max(query_lens)
    slots: list[int] = []
    positions: list[int] = []
    mask_rows: list[torch.Tensor] = []
    for b, (ctx, n) in enumerate(zip(context_lens, query_lens)):
        for k in range(n):
            j = ctx + k
            slots.append(int(block_tables[b, j // block_size]) * block_size + j % block_size)
        if tree:
            mask, depths = random_tree(n, gen)
            mask_rows.append(torch.nn.functional.pad(mask, (0, max_q - n)))
            positions.extend(ctx + d for d in depths)
        else:
            positions.extend(range(ctx, ctx + n))

    dev = torch.device(device)
    dev_gen = torch.Generator(device=dev).manual_seed(seed)
    shape = (num_blocks, num_layers, 2, block_size, num_kv_heads, head_dim)
    pool = torch.randn(shape, generator=dev_gen, device=dev, dtype=torch.float32).to(dtype)
    q = torch.randn((sum(query_lens), num_q_heads, head_dim), generator=dev_gen, device=dev,
                    dtype=torch.float32).to(dtype)
    qsl = torch.tensor([0, *torch.tensor(query_lens).cumsum(0).tolist()], dtype=torch.int32)
    meta = AttentionMetadata(
        query_start_loc=qsl.to(dev),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=dev),
        block_tables=block_tables.to(dev),
        slot_mapping=torch.tensor(slots, dtype=torch.int64, device=dev),
        positions=torch.tensor(positions, dtype=torch.int64, device=dev),
        tree_mask=torch.cat(mask_rows).to(dev) if tree else None,
        query_lens=list(query_lens),
        seq_lens_host=seq_lens,
    )
    return PagedCase(q=q, pool=pool, k_cache=pool[:, layer, 0], v_cache=pool[:, layer, 1], meta=meta,
                     scale=head_dim ** -0.5)


def race_prone_verify_case(seed: int, sampled: bool, device: torch.device | str = "cpu", batch: int = 24):
    """(target_probs, trees, uniforms) that stress the fused rejection sampler's scratch handling.

    Duplicate sibling tokens (a rejected token met again: its residual is already zero), most target mass in
    the last, partial 1024-wide vocabulary chunk and, with ``sampled``, draft q equal to the target there (a
    rejection zeroes the residual across that chunk); many sequences.  Rows are otherwise random.
    """
    from hyspec.seam.tree import TreeBatch

    vocab, nodes = 2 * 1024 + 37, 7
    gen = torch.Generator().manual_seed(100 + seed)
    last = torch.arange(2 * 1024, vocab)
    logits = torch.randn(batch * nodes, vocab, generator=gen)
    logits[:, last] += 6.0
    target = torch.softmax(logits, dim=-1)
    parents = torch.tensor([-1, 0, 0, 0, 1, 1, 4]).repeat(batch, 1)  # root: three children; a chain below
    hot = last[torch.randint(0, len(last), (batch,), generator=gen)]
    tokens = torch.randint(0, vocab, (batch, nodes), generator=gen)
    tokens[:, 1] = tokens[:, 3] = hot  # siblings 1 and 3 of the root share a token
    tokens[:, 4] = tokens[:, 5] = hot  # and so do 4 and 5
    q = None
    if sampled:
        q = torch.softmax(torch.randn(batch, nodes, vocab, generator=gen), dim=-1) * 0.1
        q[:, :, last] = target.view(batch, nodes, vocab)[:, :1, last] / target[:1, last].sum()
        q = (q / q.sum(-1, keepdim=True)).to(device)
    trees = TreeBatch(tokens.to(device), parents.to(device), torch.full((batch,), nodes, device=device), q, vocab)
    uniforms = torch.rand(batch, nodes, generator=gen, dtype=torch.float64)
    return target.to(device), trees, uniforms.to(device)
