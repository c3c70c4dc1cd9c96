"""Reference paged attention: prefill, decode and tree verification in one op.

Layout and semantics (every backend's kernel must match this reference):

* Queries of all sequences in a step are packed: ``q: [T, Hq, D]``; sequence
  ``b`` owns rows ``query_start_loc[b] : query_start_loc[b+1]`` (``n_b`` rows).
* The KV cache of one layer is paged: ``k_cache, v_cache: [num_blocks,
  block_size, Hkv, D]`` (possibly strided views into a shared pool).  Token
  ``j`` of sequence ``b`` lives in block ``block_tables[b, j // block_size]``
  at offset ``j % block_size``.
* ``seq_lens[b]`` (``L_b``) counts the sequence's KV entries *including* the
  ``n_b`` written this step, which sit at KV indices ``c_b .. L_b-1`` with
  ``c_b = L_b - n_b`` (the committed context), in query order.
* Query ``i`` of sequence ``b`` attends to every context entry ``j < c_b`` and
  to new entry ``c_b + k`` iff ``k <= i`` (causal: prefill, decode, chains) or,
  when a tree is verified, iff ``tree_mask[query_start_loc[b] + i, k]`` (the
  ancestor-or-self mask of the draft tree).

Positions for RoPE are explicit (``AttentionMetadata.positions``): a tree node
at depth ``d`` has position ``c_b + d`` although it is stored at ``c_b + k``.

With a ``sliding_window`` ``w`` (Mistral, windowed Qwen2 layers) a query at
position ``p`` sees, of what it would see, only the entries at positions
``> p - w`` (transformers' ``sliding_window_overlay``): a context entry's
position is its index, a new entry's the position of its query row, so a tree
node sees exactly what the same token sees in plain decoding.  An attention op
that honours the argument says so with ``supports_sliding_window = True``; a
model with a window its op table's attention cannot honour is refused
(hyspec.model.llama).

With a ``softcap`` ``c`` (Gemma 2's ``attn_logit_softcapping``) each scaled score
``s`` becomes ``c * tanh(s / c)`` before the mask and the softmax; an op that
honours it says so with ``supports_softcap = True``, and a model that needs it
is refused on any other (hyspec.model.gemma).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.nn.functional as F


@dataclass
class AttentionMetadata:
    """Per-step attention inputs, shared by every layer of a model."""

    query_start_loc: torch.Tensor  # [B+1] int32, cumulative query counts
    seq_lens: torch.Tensor  # [B] int32, KV length per sequence after this step's writes
    block_tables: torch.Tensor  # [B, max_blocks_per_seq] int32 (padding: any valid block id)
    slot_mapping: torch.Tensor  # [T] int64, cache slot (block * block_size + offset) of each new token
    positions: torch.Tensor  # [T] int64, RoPE position of each query token
    tree_mask: torch.Tensor | None  # [T, max_query_len] bool, None = causal
    query_lens: list[int]  # host copy of the per-sequence query counts
    seq_lens_host: list[int]  # host copy of seq_lens
    #: (max query length, max sequence length) a captured graph serves: kernels that honour it launch for
    #: these bounds, not this step's lengths (hyspec.cuda_ops.attention); None: the step's own lengths
    static_bounds: tuple[int, int] | None = None
    # Derived tensors shared by every layer of one forward (masks, gather indices), built once.
    _derived: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    def derived(self, key: str, build: Callable[[], Any]) -> Any:
        """``build()`` once per step; later layers reuse the result.

        Keyed on the host lengths too: a captured graph's metadata is updated in
        place for the next step, and must not see the previous step's mask.
        """
        full_key = (key, tuple(self.query_lens), tuple(self.seq_lens_host), id(self.block_tables), id(self.tree_mask))
        value = self._derived.get(full_key)
        if value is None:
            if len(self._derived) > 16:
                self._derived.clear()
            value = self._derived[full_key] = build()
        return value

    def __post_init__(self) -> None:
        num_seqs = len(self.query_lens)
        if len(self.seq_lens_host) != num_seqs or self.block_tables.shape[0] != num_seqs:
            raise ValueError("AttentionMetadata: per-sequence fields disagree on the batch size")
        for n, length in zip(self.query_lens, self.seq_lens_host):
            if n < 1 or n > length:
                raise ValueError(f"AttentionMetadata: query length {n} not in [1, seq_len={length}]")
        if self.tree_mask is not None and self.tree_mask.shape != (sum(self.query_lens), self.max_query_len):
            raise ValueError(
                f"AttentionMetadata: tree_mask shape {tuple(self.tree_mask.shape)} != "
                f"({sum(self.query_lens)}, {self.max_query_len})"
            )

    @property
    def num_seqs(self) -> int:
        return len(self.query_lens)

    @property
    def num_tokens(self) -> int:
        return int(self.slot_mapping.shape[0])

    @property
    def max_query_len(self) -> int:
        return max(self.query_lens)

    @property
    def max_seq_len(self) -> int:
        return max(self.seq_lens_host)


def visibility_mask(meta: AttentionMetadata, device: torch.device, sliding_window: int | None = None) -> torch.Tensor:
    """Boolean ``[B, max_query_len, max_seq_len]``: may padded query ``i`` of sequence ``b`` see KV ``j``.

    Padding query rows see KV index 0 only, so that no row of the softmax is
    empty (an all-masked row would produce NaN); their outputs are discarded.
    """
    B, Q, L = meta.num_seqs, meta.max_query_len, meta.max_seq_len
    qlens = torch.tensor(meta.query_lens, device=device)
    slens = torch.tensor(meta.seq_lens_host, device=device)
    ctx = (slens - qlens)[:, None, None]  # [B, 1, 1]
    i = torch.arange(Q, device=device)[None, :, None]  # [1, Q, 1]
    j = torch.arange(L, device=device)[None, None, :]  # [1, 1, L]
    k = j - ctx  # index among the new tokens, [B, 1, L]
    in_context = j < ctx
    if meta.tree_mask is None:
        new_visible = (k >= 0) & (k <= i) & (j < slens[:, None, None])
    else:
        # Scatter the packed [T, Q] tree mask into [B, Q, Q] then look it up by k.
        tree = torch.zeros(B, Q, Q, dtype=torch.bool, device=device)
        rows = _padded_row_index(meta, device)
        tree.view(B * Q, Q)[rows] = meta.tree_mask.to(device)
        k_clamped = k.clamp(0, Q - 1).expand(B, Q, L)
        new_visible = torch.gather(tree, 2, k_clamped) & (k >= 0) & (k < qlens[:, None, None])
    valid_query = i < qlens[:, None, None]
    mask = (in_context | new_visible) & valid_query
    if sliding_window is not None:
        mask &= _within_window(meta, device, sliding_window)
    mask[:, :, 0] |= ~valid_query[:, :, 0]
    return mask


def _within_window(meta: AttentionMetadata, device: torch.device, window: int) -> torch.Tensor:
    """``[B, Q, L]``: KV entry ``j``'s position is later than query ``i``'s position minus ``window``."""
    B, Q, L = meta.num_seqs, meta.max_query_len, meta.max_seq_len
    rows = _padded_row_index(meta, device)
    q_pos = torch.zeros(B * Q, dtype=torch.int64, device=device)
    q_pos[rows] = meta.positions.to(device=device, dtype=torch.int64)
    q_pos = q_pos.view(B, Q)
    # KV positions: a committed entry sits at its position; entry c_b + k is the k-th new token of its row
    kv_pos = torch.arange(L, device=device, dtype=torch.int64).repeat(B, 1)  # [B, L]
    for b, (n, length) in enumerate(zip(meta.query_lens, meta.seq_lens_host)):
        kv_pos[b, length - n:length] = q_pos[b, :n]
    return kv_pos[:, None, :] > (q_pos[:, :, None] - window)


def _padded_row_index(meta: AttentionMetadata, device: torch.device) -> torch.Tensor:
    """For each packed query row, its row index in the padded ``[B * max_query_len]`` layout."""
    Q = meta.max_query_len
    return torch.cat([
        torch.arange(n, device=device) + b * Q for b, n in enumerate(meta.query_lens)
    ])


def gather_kv(cache: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
    """Contiguous ``[B, max_seq_len, Hkv, D]`` copy of each sequence's paged entries."""
    block_size = cache.shape[1]
    num_blocks = -(-meta.max_seq_len // block_size)
    table = meta.derived(f"table/{num_blocks}", lambda: meta.block_tables[:, :num_blocks].reshape(-1).long())  # [B*nb]
    B = meta.block_tables.shape[0]
    gathered = cache.index_select(0, table)  # [B*nb, block_size, Hkv, D] (index_select: ~2x faster than [] here)
    return gathered.view(B, num_blocks * block_size, *cache.shape[2:])[:, : meta.max_seq_len]


def paged_attention(
    q: torch.Tensor,  # [T, Hq, D]
    k_cache: torch.Tensor,  # [num_blocks, block_size, Hkv, D]
    v_cache: torch.Tensor,  # [num_blocks, block_size, Hkv, D]
    meta: AttentionMetadata,
    scale: float,
    sliding_window: int | None = None,
    softcap: float | None = None,
) -> torch.Tensor:  # [T, Hq, D]
    """Reference attention over the paged cache (the new tokens' KV must already be written)."""
    if sliding_window is not None and meta.max_seq_len <= sliding_window:
        sliding_window = None  # no position reaches past the window yet: the same maths as without one
    B, Q = meta.num_seqs, meta.max_query_len
    Hq, D = q.shape[1], q.shape[2]
    Hkv = k_cache.shape[2]
    k = gather_kv(k_cache, meta).transpose(1, 2)  # [B, Hkv, L, D]
    v = gather_kv(v_cache, meta).transpose(1, 2)
    device = q.device
    if B == 1:
        qp = q.unsqueeze(0)  # [1, T, Hq, D]
    else:
        rows = meta.derived("padded_rows", lambda: _padded_row_index(meta, device))
        qp = q.new_zeros(B * Q, Hq, D)
        qp[rows] = q
        qp = qp.view(B, Q, Hq, D)
    if B == 1 and Q == 1 and sliding_window is None:
        mask = None  # one decode token sees its whole context: no mask, SDPA's fastest path
    else:
        mask = meta.derived(f"mask/{sliding_window}",
                            lambda: visibility_mask(meta, device, sliding_window).unsqueeze(1))  # [B, 1, Q, L]
    if softcap is None:
        out = F.scaled_dot_product_attention(
            qp.transpose(1, 2), k, v, attn_mask=mask, scale=scale, enable_gqa=(Hq != Hkv)
        )  # [B, Hq, Q, D]
    else:
        out = softcapped_attention(qp.transpose(1, 2), k, v, mask, scale, softcap)
    out = out.transpose(1, 2)  # [B, Q, Hq, D]
    if B == 1:
        return out[0]
    return out.reshape(B * Q, Hq, D)[rows]


def dense_causal_attention(
    q: torch.Tensor,  # [B, S, Hq, D]
    k: torch.Tensor,  # [B, S, Hkv, D]
    v: torch.Tensor,  # [B, S, Hkv, D]
    scale: float,
    sliding_window: int | None = None,
    softcap: float | None = None,
) -> torch.Tensor:  # [B, S, Hq, D]
    """Cache-free causal attention (positions 0..S-1), used for training and teacher forcing."""
    S = q.shape[1]
    mask = None
    if sliding_window is not None and S > sliding_window:
        i = torch.arange(S, device=q.device)
        mask = (i[None, :] <= i[:, None]) & (i[None, :] > i[:, None] - sliding_window)  # [S, S]
    if softcap is not None:
        if mask is None:
            mask = torch.ones(S, S, dtype=torch.bool, device=q.device).tril()
        out = softcapped_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), mask, scale, softcap)
        return out.transpose(1, 2)
    out = F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask,
        is_causal=mask is None, scale=scale, enable_gqa=(q.shape[2] != k.shape[2]),
    )
    return out.transpose(1, 2)


def softcapped_attention(
    q: torch.Tensor,  # [B, Hq, Q, D]
    k: torch.Tensor,  # [B, Hkv, L, D]
    v: torch.Tensor,  # [B, Hkv, L, D]
    mask: torch.Tensor | None,  # bool, broadcastable to [B, Hq, Q, L]; None: every entry visible
    scale: float,
    softcap: float,
) -> torch.Tensor:  # [B, Hq, Q, D]
    """Attention whose scores are soft-capped, ``softcap * tanh(score / softcap)``, before the softmax (as
    transformers' Gemma 2 eager attention): SDPA has no such step, so the scores are materialised."""
    group = q.shape[1] // k.shape[1]
    if group > 1:
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale
    scores = torch.tanh(scores / softcap) * softcap
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.matmul(weights, v)


paged_attention.supports_sliding_window = True
paged_attention.supports_softcap = True
