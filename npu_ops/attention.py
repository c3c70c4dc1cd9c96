"""hyspec's attention op on torch_npu: FIA for prefill, chains and trees, ATB paged attention for decode.

NOT EXECUTED ON ASCEND HARDWARE.  The argument plumbing is tested on CPU
against ``hyspec.npu_ops.emulation`` (pure-torch emulations of the documented
semantics); whether the real kernels agree is for the conformance suite on an
Ascend machine to show.

Calls (argument derivation and the mask convention: hyspec.npu_ops.attention_args)::

    # causal (prefill / decode / chains)
    torch_npu.npu_fused_infer_attention_score(
        q [T, Hq, D], key [Nv, bs, Hkv*D], value [Nv, bs, Hkv*D], atten_mask=int8 [2048, 2048],
        block_table=int32 [B, nb], input_layout="TND", block_size=bs, actual_seq_lengths=cumulative q ends,
        actual_seq_lengths_kv=seq_lens, num_heads=Hq, num_key_value_heads=Hkv, scale=scale, sparse_mode=3)
    # tree verification
    torch_npu.npu_fused_infer_attention_score(
        q [E, C, Hq, D], key, value, atten_mask=bool [E, 1, C, nb*bs], block_table=int32 [E, nb],
        input_layout="BSND", block_size=bs, actual_seq_lengths=rows per entry, actual_seq_lengths_kv=kv lens,
        num_heads=Hq, num_key_value_heads=Hkv, scale=scale, sparse_mode=0)
    # single-token decode
    torch_npu._npu_paged_attention(query=q [B, Hq, D], key_cache=[Nv, bs, Hkv, D], value_cache=...,
        num_kv_heads=Hkv, num_heads=Hq, scale_value=scale, block_table=int32 [B, nb],
        context_lens=int32 [B] (host), out=[B, Hq, D])

A sliding window (``sliding_window=w``) sends every step of that layer, decode and prefill included, to the
tree call with the window ANDed into its explicit mask (why not PA or FIA's band mode: attention_args), unless
the step's sequences all fit in the window (eager steps only: a captured graph must not change route).
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any, Callable

import torch

from hyspec.npu_ops import graph
from hyspec.npu_ops.attention_args import (TreeArgs, causal_args, causal_mask, causal_tree_mask, decode_args,
                                           tree_args)
from hyspec.npu_ops.layout import PagedCache, paged_cache
from hyspec.npu_ops.limits import (MAX_TREE_QUERY_TOKENS, NpuOpUnsupportedError, check_fia_shapes,
                                   layout_problems, paged_attention_fits, warn_once)
from hyspec.ops.attention import AttentionMetadata
from hyspec.ops.attention import paged_attention as reference_attention


@dataclass(frozen=True)
class NpuAttentionConfig:
    max_tree_query_tokens: int = MAX_TREE_QUERY_TOKENS  # rows per FIA tree entry
    split_large_trees: bool = True  # False: a request with more tree rows raises instead of being split
    paged_attention_for_decode: bool = True  # use ATB PA for all-single-token steps when present

    def __post_init__(self) -> None:
        if not 1 <= self.max_tree_query_tokens <= MAX_TREE_QUERY_TOKENS:
            raise ValueError(f"max_tree_query_tokens must be in [1, {MAX_TREE_QUERY_TOKENS}], "
                             f"got {self.max_tree_query_tokens}")


class _StepCache:
    """One value per step (tree arguments, the causal mask, the route): every layer shares one metadata
    object, so each is built once."""

    def __init__(self) -> None:
        self._key: tuple | None = None
        self._meta: weakref.ref | None = None
        self._args: TreeArgs | None = None

    def get(self, meta: AttentionMetadata, key: tuple) -> Any:
        alive = self._meta is not None and self._meta() is meta
        return self._args if alive and key == self._key else None

    def put(self, meta: AttentionMetadata, key: tuple, args: Any) -> None:
        self._key, self._meta, self._args = key, weakref.ref(meta), args


class NpuAttention:
    """``OpTable.attention`` backed by torch_npu (see the module docstring)."""

    supports_sliding_window = True  # through the explicit-mask route (module docstring)

    def __init__(self, fia: Callable | None, paged_attention: Callable | None = None,
                 config: NpuAttentionConfig = NpuAttentionConfig(), limits: Any = None):
        if fia is None and paged_attention is None:
            raise ValueError("NpuAttention needs npu_fused_infer_attention_score or _npu_paged_attention")
        self.fia = fia
        self.paged_attention = paged_attention
        self.config = config
        # the release's documented PageAttention layouts (hyspec.npu_ops.op_schemas); None: generic limits only
        fia_limits = limits.limits("npu_fused_infer_attention_score") if limits is not None else {}
        self.layout_rules: dict | None = fia_limits.get("paged_layouts")
        # one cache per window: the layers of one step share a route and masks per window (Gemma alternates)
        self._tree_caches: dict[int | None, _StepCache] = {}
        self._causal_masks = _StepCache()
        self._route_caches: dict[int | None, _StepCache] = {}

    def __call__(
        self,
        q: torch.Tensor,  # [T, Hq, D]
        k_cache: torch.Tensor,  # [num_blocks, block_size, Hkv, D], maybe a strided pool view
        v_cache: torch.Tensor,  # [num_blocks, block_size, Hkv, D]
        meta: AttentionMetadata,
        scale: float,
        sliding_window: int | None = None,
    ) -> torch.Tensor:  # [T, Hq, D]
        if sliding_window is not None and (isinstance(sliding_window, bool) or not isinstance(sliding_window, int)
                                           or sliding_window < 1):
            raise ValueError(f"NPU attention: sliding_window must be a positive integer or None, got "
                             f"{sliding_window!r}")
        static = graph.capturing()
        if sliding_window is not None and meta.max_seq_len <= sliding_window and not static:
            sliding_window = None  # nothing reaches past the window this step: the unwindowed routes serve it
        cache = paged_cache(k_cache, v_cache)
        key = (tuple(q.shape), q.dtype, tuple(cache.key.shape), cache.key.dtype, meta.max_query_len, meta.num_seqs,
               meta.max_seq_len, meta.tree_mask is None)
        routes = self._route_caches.setdefault(sliding_window, _StepCache())
        decided = routes.get(meta, key)
        if decided is None:
            decided = self.route(q, cache, meta, sliding_window)
            routes.put(meta, key, decided)
        route, why = decided
        if route == "reference":
            warn_once(f"attention:{why}", f"NPU attention runs the reference op: {why}")
            return reference_attention(q, k_cache, v_cache, meta, scale, sliding_window=sliding_window)
        q = q.contiguous()
        if route == "paged_attention":
            return self._decode(q, cache, meta, scale, static)
        if route == "TND":
            return self._causal(q, cache, meta, scale, static)
        return self._tree(q, cache, meta, scale, static, self._tree_mask(meta), sliding_window)

    def route(self, q: torch.Tensor, cache: PagedCache, meta: AttentionMetadata,
              sliding_window: int | None = None) -> tuple[str, str | None]:
        """("paged_attention" | "TND" | "BSND" | "reference", why the reference) for this step.

        Single-token decode goes to ATB PA where it fits; causal steps to TND
        (sparse_mode 3) where the release documents TND PageAttention for this
        head dim, else to BSND with an explicit causal mask; trees to BSND.
        A windowed step goes to BSND whatever its shape: only the explicit
        mask carries the window (module docstring).
        """
        windowed = sliding_window is not None
        if meta.max_query_len == 1 and not windowed and self._use_paged_attention(q, cache, meta):
            return "paged_attention", None
        if self.fia is None:
            return "reference", "this torch_npu offers no usable npu_fused_infer_attention_score"
        problems = check_fia_shapes(q, cache.key, meta.num_seqs, cache.block_size, meta.max_seq_len)
        if problems:
            return "reference", "; ".join(problems)
        multi = meta.max_query_len > 1
        args = (q.shape[2], q.dtype, cache.block_size, multi, meta.num_seqs)
        tnd = layout_problems(self.layout_rules, "TND", *args)
        if (meta.tree_mask is None or not multi) and not tnd and not windowed:  # a one-node tree is causal
            return "TND", None
        bsnd = layout_problems(self.layout_rules, "BSND", *args)
        if not bsnd:
            return "BSND", None
        if windowed:
            return "reference", "; ".join(bsnd + [f"sliding window {sliding_window}: only BSND's explicit mask "
                                                  "carries it"])
        return "reference", "; ".join(bsnd + ([] if meta.tree_mask is not None and multi else tnd))

    def _tree_mask(self, meta: AttentionMetadata) -> torch.Tensor:
        """The step's tree mask, or for a causal step on BSND the causal one (each row sees its predecessors)."""
        if meta.tree_mask is not None:
            return meta.tree_mask
        key = (tuple(meta.query_lens),)
        mask = self._causal_masks.get(meta, key)
        if mask is None:
            mask = causal_tree_mask(meta)
            self._causal_masks.put(meta, key, mask)
        return mask

    def _use_paged_attention(self, q: torch.Tensor, cache: PagedCache, meta: AttentionMetadata) -> bool:
        return (self.paged_attention is not None and self.config.paged_attention_for_decode
                and paged_attention_fits(q.shape[2], cache.block_size, meta.max_seq_len))

    def _fia_common(self, q: torch.Tensor, cache: PagedCache, scale: float) -> dict:
        return dict(block_size=cache.block_size, num_heads=q.shape[1], num_key_value_heads=cache.key.shape[2],
                    scale=scale)

    def _causal(self, q, cache, meta, scale, static) -> torch.Tensor:
        args = causal_args(meta, cache, static_shapes=static)
        kwargs = dict(atten_mask=causal_mask(q.device), block_table=args.block_table, input_layout="TND",
                      actual_seq_lengths=args.actual_seq_lengths, actual_seq_lengths_kv=args.actual_seq_lengths_kv,
                      sparse_mode=3, **self._fia_common(q, cache, scale))
        return self._launch_fia(q, cache, kwargs, lambda m: {"actual_seq_lengths_kv": list(m.seq_lens_host)})

    def _tree(self, q, cache, meta, scale, static, tree_mask, sliding_window=None) -> torch.Tensor:
        cap = self.config.max_tree_query_tokens
        if meta.max_query_len > cap and not self.config.split_large_trees:
            raise NpuOpUnsupportedError(
                f"NPU tree attention: a request verifies {meta.max_query_len} tree tokens, FIA serves at most {cap} "
                "query rows per request against a tree mask; shrink the tree budget or enable split_large_trees")
        # keyed on the capture too: a mask built before capturing would be a constant inside the graph
        key = (id(tree_mask), id(meta.block_tables), tuple(meta.query_lens), tuple(meta.seq_lens_host),
               cache.block_stride, cache.block_size, cap, id(graph.active_capture()), id(meta.positions))
        tree_cache = self._tree_caches.setdefault(sliding_window, _StepCache())
        args = tree_cache.get(meta, key)
        if args is None:
            args = tree_args(meta, cache, cap, static_shapes=static, tree_mask=tree_mask,
                             sliding_window=sliding_window)
            tree_cache.put(meta, key, args)
        pieces = args.pieces
        E, C = len(pieces.entry_rows), pieces.rows
        q_padded = q.index_select(0, pieces.gather).view(E, C, q.shape[1], q.shape[2])  # [E, C, Hq, D]
        kwargs = dict(atten_mask=args.atten_mask, block_table=args.block_table, input_layout="BSND",
                      actual_seq_lengths=args.actual_seq_lengths, actual_seq_lengths_kv=args.actual_seq_lengths_kv,
                      sparse_mode=0, **self._fia_common(q, cache, scale))
        entry_seq = pieces.entry_seq_host
        out = self._launch_fia(q_padded, cache, kwargs, lambda m: {  # [E, C, Hq, D]
            "actual_seq_lengths_kv": [m.seq_lens_host[b] for b in entry_seq]})
        return out.reshape(E * C, q.shape[1], q.shape[2]).index_select(0, pieces.scatter)

    def _launch_fia(self, query: torch.Tensor, cache: PagedCache, kwargs: dict,
                    refresh: Callable[[AttentionMetadata], dict]) -> torch.Tensor:
        capture = graph.active_capture()
        if capture is not None:
            return capture.launch_fia(self.fia, query, cache.key_bsh(), cache.value_bsh(), kwargs, refresh)
        out, _lse = self.fia(query, cache.key_bsh(), cache.value_bsh(), **kwargs)
        return out

    def _decode(self, q, cache, meta, scale, static) -> torch.Tensor:
        args = decode_args(meta, cache, static_shapes=static)
        kwargs = dict(query=q, key_cache=cache.key, value_cache=cache.value, num_kv_heads=cache.key.shape[2],
                      num_heads=q.shape[1], scale_value=scale, block_table=args.block_table,
                      context_lens=args.context_lens)
        capture = graph.active_capture()
        if capture is not None:
            return capture.launch_paged_attention(self.paged_attention, kwargs, lambda m: {
                "context_lens": torch.tensor(m.seq_lens_host, dtype=torch.int32)})
        out = torch.empty_like(q)
        self.paged_attention(**kwargs, out=out)
        return out
