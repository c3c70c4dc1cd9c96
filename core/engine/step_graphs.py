"""Captured forwards for decode and verification steps: static buffers per (batch bucket, query budget).

A recorded graph (a CUDA graph) replays its kernel launches exactly as they
were captured: same grids, same scalars, same buffer addresses.  So a step
that runs through one must (a) find its inputs in buffers that live as long
as the graph, (b) launch for fixed bounds instead of this step's lengths and
(c) read nothing back to the host on the way.  This module provides (a) and
asks the kernels for (b) through ``AttentionMetadata.static_bounds``; (c) is
what the kernels and the model code guarantee and what
:class:`hyspec.graph_capture.ReexecutingCapturer` checks.

Shapes, as vLLM and SGLang do it: a step with ``B`` sequences feeding at most
``q`` tokens each runs the graph of the smallest captured batch bucket
``>= B`` and query budget ``>= q`` (powers of two).  Its ``bucket x budget``
token rows hold the real tokens first, packed exactly as
:func:`hyspec.seam.forward.build_inputs` packs them, then padding rows
that belong to no sequence: their KV slot is -1 (the write kernels skip
it), no attention program reads them and their attention output is zero
(rows past ``query_start_loc[num_seqs]``), so they stay finite.  Padding
sequences have zero queries and zero keys, so their programs exit on the
device.  Every row of a linear layer, norm or rotary is computed on its
own, so padding never changes a real row.  Logits are computed after the replay on the
wanted rows only (their row set changes every step).

Steps that do not fit (a prefill chunk longer than the largest budget, more
sequences than the largest bucket, a sequence past the bounds, a graph that
would compute mostly padding) run eagerly;
graphs are captured lazily, the first time a shape is seen, up to
``max_graphs``.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from hyspec.graph_capture import GraphCapturer
from hyspec.ops import AttentionMetadata

log = logging.getLogger(__name__)

#: the largest query budget captured by default: chains of 63 drafts, trees of 64 nodes
DEFAULT_MAX_QUERY = 64
DEFAULT_MAX_GRAPHS = 64
#: a step runs eagerly when its graph's rows exceed PADDING_FACTOR x its own rows + PADDING_SLACK: padding is
#: computed like real rows, and a mixed prefill/decode step padded to (batch x longest chunk) would waste most
PADDING_FACTOR, PADDING_SLACK = 2, 16


def batch_buckets(max_num_seqs: int, sizes: list[int] | None = None) -> tuple[int, ...]:
    """Batch sizes graphs are captured for: ``sizes`` or 1, 2, 4, ... up to ``max_num_seqs`` (always included)."""
    if sizes is None:
        sizes, b = [], 1
        while b < max_num_seqs:
            sizes.append(b)
            b *= 2
        sizes.append(max_num_seqs)
    if not sizes or any(isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in sizes):
        raise ValueError(f"graph batch sizes must be positive integers, got {sizes!r}")
    return tuple(sorted(set(sizes)))


def _bucket(value: int, buckets: tuple[int, ...]) -> int | None:
    return next((b for b in buckets if b >= value), None)


@dataclass(frozen=True)
class GraphKey:
    batch: int  # sequences the graph serves (padding sequences included)
    query: int  # query rows per sequence it has room for
    tree: bool  # verification through an ancestor mask
    aux_layers: tuple[int, ...]  # hidden states returned besides the last


class _StaticStep:
    """The buffers one graph reads and writes; a step's inputs are copied into them before a replay."""

    def __init__(self, key: GraphKey, max_len: int, block_size: int, device: torch.device):
        T, B = key.batch * key.query, key.batch
        width = -(-max_len // block_size)
        self.key = key
        self.input_ids = torch.zeros(T, dtype=torch.int64, device=device)
        self.positions = torch.zeros(T, dtype=torch.int64, device=device)
        self.slot_mapping = torch.full((T,), -1, dtype=torch.int64, device=device)
        self.query_start_loc = torch.zeros(B + 1, dtype=torch.int32, device=device)
        self.seq_lens = torch.zeros(B, dtype=torch.int32, device=device)
        self.block_tables = torch.zeros(B, width, dtype=torch.int32, device=device)
        self.tree_mask = torch.zeros(T, key.query, dtype=torch.bool, device=device) if key.tree else None
        # the host lists describe the bounds, not a step: kernels launched for static_bounds never read them
        self.meta = AttentionMetadata(
            query_start_loc=self.query_start_loc, seq_lens=self.seq_lens, block_tables=self.block_tables,
            slot_mapping=self.slot_mapping, positions=self.positions, tree_mask=self.tree_mask,
            query_lens=[key.query] * B, seq_lens_host=[max(max_len, key.query)] * B,
            static_bounds=(key.query, max(max_len, key.query)))
        self.replay: Callable[[], None] | None = None
        self.hidden: torch.Tensor | None = None
        self.aux: tuple[torch.Tensor, ...] = ()

    def load(self, meta: AttentionMetadata, input_ids: torch.Tensor) -> None:
        """Copy one step's packed inputs in; the rest becomes padding."""
        T, B = int(input_ids.shape[0]), meta.num_seqs
        self.input_ids[:T].copy_(input_ids)
        self.input_ids[T:].zero_()
        self.positions[:T].copy_(meta.positions)
        self.positions[T:].zero_()
        self.slot_mapping[:T].copy_(meta.slot_mapping)
        self.slot_mapping[T:].fill_(-1)
        self.query_start_loc[:B + 1].copy_(meta.query_start_loc)
        self.query_start_loc[B + 1:].fill_(T)
        self.seq_lens[:B].copy_(meta.seq_lens)
        self.seq_lens[B:].zero_()
        self.block_tables.zero_()
        self.block_tables[:B, :meta.block_tables.shape[1]].copy_(meta.block_tables)
        if self.tree_mask is not None:  # a tree graph serves only steps with a mask (key.tree)
            self.tree_mask.zero_()
            self.tree_mask[:T, :meta.tree_mask.shape[1]].copy_(meta.tree_mask)

    def clear(self) -> None:
        """Padding only: no sequence, no KV write (the state a graph is captured in)."""
        self.input_ids.zero_()
        self.positions.zero_()
        self.slot_mapping.fill_(-1)
        self.query_start_loc.zero_()
        self.seq_lens.zero_()
        self.block_tables.zero_()
        if self.tree_mask is not None:
            self.tree_mask.zero_()


@dataclass
class GraphStats:
    captures: int = 0
    capture_seconds: float = 0.0
    replays: int = 0
    eager: dict[str, int] = field(default_factory=dict)  # reason -> steps run eagerly

    def as_dict(self) -> dict:
        return {"captures": self.captures, "capture_seconds": round(self.capture_seconds, 3),
                "replays": self.replays, "eager": dict(self.eager)}


class StepGraphs:
    """Replays captured forwards of ``model`` for steps that fit a (batch bucket, query budget)."""

    def __init__(self, model, caches: list, capturer: GraphCapturer, *, block_size: int, max_len: int,
                 batch_sizes: tuple[int, ...], max_query: int = DEFAULT_MAX_QUERY,
                 max_graphs: int = DEFAULT_MAX_GRAPHS, device: torch.device | None = None):
        if max_len > model.max_positions:
            raise ValueError(f"graph bound max_len {max_len} exceeds the model's RoPE table ({model.max_positions})")
        self.model = model
        self.caches = caches
        self.capturer = capturer
        self.block_size = block_size
        self.max_len = max_len
        self.batch_sizes = batch_sizes
        self.query_budgets = tuple(1 << i for i in range(max(1, max_query).bit_length())
                                   if 1 << i <= max_query) or (1,)
        self.max_graphs = max_graphs
        self.device = device if device is not None else model.embed_tokens.weight.device
        self.graphs: dict[GraphKey, _StaticStep] = {}
        self.stats = GraphStats()

    def release(self) -> None:
        """Drop every captured graph and its static buffers (the engine is closing); counts are kept."""
        self.graphs.clear()

    def _eager(self, reason: str) -> None:
        self.stats.eager[reason] = self.stats.eager.get(reason, 0) + 1

    def key_for(self, query_lens: list[int], seq_lens: list[int], table_width: int, tree: bool,
                aux_layers: tuple[int, ...]) -> GraphKey | None:
        """The graph a step with these per-sequence lengths runs in, or None (and why, in ``stats.eager``)."""
        batch = _bucket(len(query_lens), self.batch_sizes)
        query = _bucket(max(query_lens), self.query_budgets)
        if batch is None:
            self._eager("batch")
        elif query is None:
            self._eager("query")
        elif max(seq_lens) > self.max_len or table_width > -(-self.max_len // self.block_size):
            self._eager("length")
        elif batch * query > PADDING_FACTOR * sum(query_lens) + PADDING_SLACK:
            self._eager("padding")  # e.g. one prefill chunk among decodes: the graph would compute mostly padding
        else:
            return GraphKey(batch, query, tree, aux_layers)
        return None

    def run(self, key: GraphKey, input_ids: torch.Tensor, meta: AttentionMetadata
            ) -> tuple[torch.Tensor, dict[int, torch.Tensor]] | None:
        """Final hidden states ``[T, H]`` and aux states of a step packed as ``meta`` (copies, not the static
        buffers), or None when no more graphs may be captured."""
        step = self.graphs.get(key)
        if step is None:
            if len(self.graphs) >= self.max_graphs:
                self._eager("max_graphs")
                return None
            step = self._capture(key)
        step.load(meta, input_ids)
        step.replay()
        T = int(input_ids.shape[0])
        self.stats.replays += 1
        return step.hidden[:T].clone(), {i: t[:T].clone() for i, t in zip(key.aux_layers, step.aux)}

    def _capture(self, key: GraphKey) -> _StaticStep:
        step = _StaticStep(key, self.max_len, self.block_size, self.device)
        step.clear()
        model, caches = self.model, self.caches

        def forward() -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
            out = model(step.input_ids, step.positions, caches, step.meta, aux_layers=key.aux_layers)
            return out.hidden, tuple(out.aux_hidden[i] for i in key.aux_layers)

        started = time.perf_counter()
        with torch.inference_mode():
            step.replay, (step.hidden, step.aux) = self.capturer.capture(forward)
        elapsed = time.perf_counter() - started
        self.graphs[key] = step
        self.stats.captures += 1
        self.stats.capture_seconds += elapsed
        log.info("captured a %s for %d sequences x %d query rows%s in %.3f s (%d graphs)", self.capturer.kind,
                 key.batch, key.query, " (tree)" if key.tree else "", elapsed, len(self.graphs))
        return step


__all__ = ["DEFAULT_MAX_GRAPHS", "DEFAULT_MAX_QUERY", "GraphKey", "GraphStats", "StepGraphs", "batch_buckets"]
