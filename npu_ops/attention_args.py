"""Arguments of the torch_npu attention calls, derived from hyspec's ``AttentionMetadata``.

Three calls serve hyspec's one attention op (semantics: hyspec.ops.attention):

* causal steps (prefill, decode, chains; ``tree_mask is None``):
  FIA, ``input_layout="TND"``, ``sparse_mode=3`` (rightDownCausal) with the
  2048x2048 ``int8`` mask ``triu(ones, 1)`` (1 = masked out), cumulative
  ``actual_seq_lengths`` (query ends) and per-request
  ``actual_seq_lengths_kv`` (= ``seq_lens``, which include the new tokens).
  rightDownCausal aligns query ``i`` of a request with KV index
  ``kv_len - q_len + i``: exactly hyspec's "context ``c = L - n`` plus the
  new tokens up to ``i``".
* tree verification (``tree_mask`` given): FIA, ``input_layout="BSND"``,
  ``sparse_mode=0`` with an explicit ``bool`` mask ``[B', 1, C, KV_S]``
  (True = masked out, the Ascend convention) that holds the context prefix
  (visible) and each request's ancestor mask over its new tokens.  The
  compressed 2048x2048 mask of sparse_mode 2-4 is shared by every request
  and documented as lower-triangular, so it cannot carry per-request trees.
  Requests with more than ``cap`` (16) query rows are split into pieces of at
  most ``cap`` rows: each piece is its own batch entry with the same block
  table row and KV length, so splitting changes nothing numerically.
* single-token decode: ATB ``_npu_paged_attention`` with int32
  ``block_table`` and host ``context_lens``.
* a sliding window ``w`` (hyspec.ops.attention: a query at position ``p`` sees
  the entries at positions ``> p - w``): every step of a windowed layer takes
  the explicit-mask call (BSND, sparse_mode 0) with the window ANDed into the
  mask, built on the device from ``positions`` and ``seq_lens``.  ATB paged
  attention takes no mask; FIA documents ``pre_tokens`` / ``next_tokens`` as
  having no effect when Q_S = 1, and for its band mode (sparse_mode 4) states
  no alignment or inclusivity (op-plugin docs/zh/custom_APIs/torch_npu/
  torch_npu-npu_fused_infer_attention_score.md at 09fca6f6), so neither can
  carry the window here until an Ascend run pins the band down.

With ``static_shapes`` (NPU graph capture) nothing depends on values that
change between replays except the FIA/PA host length lists, which the graph
runner re-issues before each replay: the block table keeps its full width and
the mask covers ``width * block_size`` keys.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from hyspec.npu_ops.layout import PagedCache
from hyspec.npu_ops.limits import check_tree_entries
from hyspec.ops.attention import AttentionMetadata

CAUSAL_MASK_SIZE = 2048
_causal_masks: dict[torch.device, torch.Tensor] = {}


def causal_mask(device: torch.device) -> torch.Tensor:  # [2048, 2048] int8, 1 above the diagonal
    """The "optimised" mask sparse_mode 3 takes (built once per device, as vllm-ascend does)."""
    if device not in _causal_masks:
        ones = torch.ones(CAUSAL_MASK_SIZE, CAUSAL_MASK_SIZE, dtype=torch.bool)
        _causal_masks[device] = ones.triu(1).to(torch.int8).to(device)
    return _causal_masks[device]


@dataclass(frozen=True)
class CausalArgs:
    actual_seq_lengths: list[int]  # cumulative query ends, TND
    actual_seq_lengths_kv: list[int]  # KV length per request
    block_table: torch.Tensor  # [B, nb] int32 virtual block ids


@dataclass(frozen=True)
class DecodeArgs:
    block_table: torch.Tensor  # [B, nb] int32 virtual block ids
    context_lens: torch.Tensor  # [B] int32 on the host, as ATB reads it


@dataclass(frozen=True)
class TreePieces:
    """How packed query rows map onto FIA batch entries (depends on query_lens only)."""

    entry_seq: torch.Tensor  # [E] long: the request each entry belongs to
    entry_seq_host: list[int]
    entry_rows: list[int]  # rows per entry (<= cap)
    rows: int  # C: padded rows per entry
    rows_valid: torch.Tensor  # [E, C] bool: padded row i of entry e is a real query
    gather: torch.Tensor  # [E * C] long: packed query row feeding each padded row (padding reads its entry's first)
    scatter: torch.Tensor  # [T] long: padded row holding each packed row's output


@dataclass(frozen=True)
class TreeArgs:
    pieces: TreePieces
    actual_seq_lengths: list[int]  # query rows per entry (BSND: per batch, not cumulative)
    actual_seq_lengths_kv: list[int]  # KV length per entry
    block_table: torch.Tensor  # [E, nb] int32 virtual block ids
    atten_mask: torch.Tensor  # [E, 1, C, nb * block_size] bool, True = masked out


def _table_width(meta: AttentionMetadata, block_size: int, static_shapes: bool) -> int:
    if static_shapes:
        return int(meta.block_tables.shape[1])
    return min(int(meta.block_tables.shape[1]), math.ceil(meta.max_seq_len / block_size))


def causal_args(meta: AttentionMetadata, cache: PagedCache, static_shapes: bool = False) -> CausalArgs:
    width = _table_width(meta, cache.block_size, static_shapes)
    ends, total = [], 0
    for n in meta.query_lens:
        total += n
        ends.append(total)
    return CausalArgs(actual_seq_lengths=ends, actual_seq_lengths_kv=list(meta.seq_lens_host),
                      block_table=cache.block_table(meta.block_tables[:, :width]))


def decode_args(meta: AttentionMetadata, cache: PagedCache, static_shapes: bool = False) -> DecodeArgs:
    width = _table_width(meta, cache.block_size, static_shapes)
    return DecodeArgs(block_table=cache.block_table(meta.block_tables[:, :width]),
                      context_lens=torch.tensor(meta.seq_lens_host, dtype=torch.int32))


_pieces_cache: dict[tuple, TreePieces] = {}


def tree_pieces(query_lens: list[int], cap: int, device: torch.device) -> TreePieces:
    """Split each request's rows into entries of at most ``cap`` rows (cached: graph replays reuse them)."""
    key = (tuple(query_lens), cap, device)
    if key in _pieces_cache:
        return _pieces_cache[key]
    seqs, firsts, counts = [], [], []
    start = 0
    for b, n in enumerate(query_lens):
        for r0 in range(0, n, cap):
            seqs.append(b)
            firsts.append(start + r0)
            counts.append(min(cap, n - r0))
        start += n
    check_tree_entries(len(seqs))
    rows = max(counts)
    gather, scatter, valid = [], [], []
    for e, (first, m) in enumerate(zip(firsts, counts)):
        gather.extend(first + i if i < m else first for i in range(rows))
        scatter.extend(e * rows + i for i in range(m))
        valid.append([i < m for i in range(rows)])
    as_long = {"dtype": torch.long, "device": device}
    pieces = TreePieces(entry_seq=torch.tensor(seqs, **as_long), entry_seq_host=seqs, entry_rows=counts, rows=rows,
                        rows_valid=torch.tensor(valid, dtype=torch.bool, device=device),
                        gather=torch.tensor(gather, **as_long), scatter=torch.tensor(scatter, **as_long))
    if len(_pieces_cache) > 64:  # shapes repeat; an unbounded cache would only grow with odd batches
        _pieces_cache.clear()
    _pieces_cache[key] = pieces
    return pieces


def causal_tree_mask(meta: AttentionMetadata) -> torch.Tensor:  # [T, max_query_len] bool
    """The causal rule as a tree mask: row ``i`` of a request sees its new tokens ``0..i`` (for BSND steps)."""
    device = meta.query_start_loc.device
    qsl = meta.query_start_loc.to(dtype=torch.long)
    lens = qsl[1:] - qsl[:-1]
    T = int(qsl[-1])
    local = torch.arange(T, device=device) - torch.repeat_interleave(qsl[:-1], lens, output_size=T)
    return torch.arange(meta.max_query_len, device=device)[None, :] <= local[:, None]


def tree_args(meta: AttentionMetadata, cache: PagedCache, cap: int, static_shapes: bool = False,
              tree_mask: torch.Tensor | None = None, sliding_window: int | None = None) -> TreeArgs:
    tree_mask = meta.tree_mask if tree_mask is None else tree_mask
    if tree_mask is None:
        raise ValueError("tree_args needs a tree_mask")
    device = tree_mask.device
    pieces = tree_pieces(meta.query_lens, cap, device)
    width = _table_width(meta, cache.block_size, static_shapes)
    seq = pieces.entry_seq
    qsl = meta.query_start_loc.to(device=device, dtype=torch.long)
    seq_lens = meta.seq_lens.to(device=device, dtype=torch.long)
    qlen = (qsl[1:] - qsl[:-1])[seq]  # [E] query rows of the entry's request
    kv_len = seq_lens[seq]  # [E]
    context = kv_len - qlen  # [E] committed KV before this step's tokens
    window = None
    if sliding_window is not None:
        window = WindowRule(sliding_window, meta.positions.to(device=device, dtype=torch.long), qsl[:-1][seq])
    mask = tree_mask_for_fia(tree_mask, pieces, context, qlen, width * cache.block_size, window)
    table = meta.block_tables[:, :width].index_select(0, seq.to(meta.block_tables.device))
    return TreeArgs(pieces=pieces, actual_seq_lengths=list(pieces.entry_rows),
                    actual_seq_lengths_kv=[meta.seq_lens_host[b] for b in pieces.entry_seq_host],
                    block_table=cache.block_table(table), atten_mask=mask)


@dataclass(frozen=True)
class WindowRule:
    """A sliding window as the mask builder needs it (device tensors: a captured graph replays the build)."""

    window: int
    positions: torch.Tensor  # [T] long, position of each packed query row
    first_row: torch.Tensor  # [E] long, packed row of the first query of each entry's request


def tree_mask_for_fia(
    tree_mask: torch.Tensor,  # [T, max_query_len] bool, ancestor-or-self over each request's new tokens
    pieces: TreePieces,
    context: torch.Tensor,  # [E] long, committed KV length of each entry's request
    qlen: torch.Tensor,  # [E] long, new tokens of each entry's request
    kv_width: int,  # KV_S of the mask: the block table width times block_size
    window: WindowRule | None = None,
) -> torch.Tensor:  # [E, 1, C, kv_width] bool, True = masked out
    """hyspec's visibility rule as FIA's explicit ``atten_mask`` (sparse_mode 0).

    Row ``i`` of entry ``e`` (packed row ``gather[e * C + i]``) sees every
    context key ``j < context[e]`` and new key ``context[e] + k`` iff
    ``tree_mask[row, k]``; keys past the request's length are masked.  With a
    ``window`` it sees, of those, only the keys at positions ``> p - w`` (``p``
    its position; a context key's position is its index, new key ``k``'s the
    position of its request's query row ``k``).  Padded rows see key 0 only,
    so no row is entirely masked (FIA would otherwise need its row-invalid
    correction, inner_precise 2/3); their outputs are dropped.
    """
    E, C = len(pieces.entry_rows), pieces.rows
    Q = tree_mask.shape[1]
    device = tree_mask.device
    rows_valid = pieces.rows_valid  # [E, C]
    packed = pieces.gather.view(E, C)  # [E, C] packed row of each padded row
    visible = torch.zeros(E, C, kv_width + 1, dtype=torch.bool, device=device)  # last column: a sink for misses
    visible[:, :, :kv_width] = torch.arange(kv_width, device=device)[None, None, :] < context[:, None, None]
    k = torch.arange(Q, device=device)
    column = context[:, None] + k[None, :]  # [E, Q] key index of new token k
    in_request = (k[None, :] < qlen[:, None]) & (column < kv_width)
    column = torch.where(in_request, column, torch.full_like(column, kv_width))
    new_visible = tree_mask[packed] & in_request[:, None, :]  # [E, C, Q]
    visible.scatter_(2, column[:, None, :].expand(E, C, Q), new_visible)
    visible = visible[:, :, :kv_width] & rows_valid[:, :, None]
    if window is not None:
        last_row = window.positions.shape[0] - 1
        kv_pos = torch.arange(kv_width + 1, device=device).repeat(E, 1)  # [E, kv_width + 1], the sink again
        new_pos = window.positions[(window.first_row[:, None] + k[None, :]).clamp(max=last_row)]  # [E, Q]
        kv_pos.scatter_(1, column, new_pos)
        q_pos = window.positions[packed]  # [E, C]
        visible &= kv_pos[:, None, :kv_width] > (q_pos[:, :, None] - window.window)
    visible[:, :, 0] |= ~rows_valid
    return (~visible).unsqueeze(1)
