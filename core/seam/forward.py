"""Turn a list of per-sequence feeds into one packed forward over the paged cache.

A *feed* is one sequence's share of a forward: tokens written at KV indices
``start .. start+n-1``, at positions ``start + depth`` (depth = index for a
prefill chunk or chain, tree depth for a draft tree), attending causally or
through an ancestor mask.  Prefill chunks, decodes and draft trees of many
sequences go through one model call.  The same runner serves the target and
any drafter with its own KV layout.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Hashable, Protocol

import torch

from hyspec.kv.sequence_kv import SequenceKV
from hyspec.ops import AttentionMetadata

NO_LOGITS, LAST_LOGITS, ALL_LOGITS = "none", "last", "all"


@dataclass
class Feed:
    kv: SequenceKV
    tokens: list[int]
    start: int  # KV index of the first token (= entries already kept)
    depths: list[int] | None = None  # per token; None = 0..n-1
    tree_mask: torch.Tensor | None = None  # [n, n] bool ancestor-or-self; None = causal
    logits: str = ALL_LOGITS

    def __post_init__(self) -> None:
        if not self.tokens:
            raise ValueError("a feed needs at least one token")
        if self.tree_mask is not None and self.tree_mask.shape != (len(self.tokens), len(self.tokens)):
            raise ValueError(f"tree_mask shape {tuple(self.tree_mask.shape)} != ({len(self.tokens)}, {len(self.tokens)})")


@dataclass
class BatchInputs:
    input_ids: torch.Tensor  # [T]
    positions: torch.Tensor  # [T]
    meta: AttentionMetadata
    logits_index: torch.Tensor  # [R] rows of the packed batch whose logits are wanted
    logits_rows: list[tuple[int, int]]  # per feed: (first row in logits_index order, count)
    token_rows: list[tuple[int, int]]  # per feed: (first packed row, count)


def build_inputs(feeds: list[Feed], device: torch.device) -> BatchInputs:
    """Pack feeds into model inputs; reserves nothing (the caller reserved pages)."""
    ids: list[int] = []
    positions: list[int] = []
    slots: list[int] = []
    qlens, slens, tables = [], [], []
    logits_index: list[int] = []
    logits_rows, token_rows = [], []
    any_tree = any(f.tree_mask is not None for f in feeds)
    for f in feeds:
        n = len(f.tokens)
        f.kv.check_writable(f.start, n)
        first = len(ids)
        ids.extend(f.tokens)
        depths = range(n) if f.depths is None else f.depths
        positions.extend(f.start + d for d in depths)
        slots.extend(f.kv.slots(f.start, n))
        qlens.append(n)
        slens.append(f.start + n)
        tables.append(f.kv.pages)
        token_rows.append((first, n))
        r0 = len(logits_index)
        if f.logits == ALL_LOGITS:
            logits_index.extend(range(first, first + n))
        elif f.logits == LAST_LOGITS:
            logits_index.append(first + n - 1)
        logits_rows.append((r0, len(logits_index) - r0))
    max_pages = max(len(t) for t in tables)
    # one tensor from padded lists: a copy per row was two tensor ops a sequence, every step
    block_tables = torch.tensor([[*t, *[0] * (max_pages - len(t))] for t in tables], dtype=torch.int32)
    block_tables = block_tables.reshape(len(feeds), max_pages)
    tree_mask = None
    if any_tree:
        Q = max(qlens)
        tree_mask = torch.zeros(len(ids), Q, dtype=torch.bool)
        for f, (first, n) in zip(feeds, token_rows):
            m = f.tree_mask if f.tree_mask is not None else torch.ones(n, n, dtype=torch.bool).tril()
            tree_mask[first:first + n, :n] = m
        tree_mask = tree_mask.to(device)
    qsl = torch.zeros(len(feeds) + 1, dtype=torch.int32)
    qsl[1:] = torch.cumsum(torch.tensor(qlens, dtype=torch.int32), 0)
    pos = torch.tensor(positions, dtype=torch.int64, device=device)
    meta = AttentionMetadata(
        query_start_loc=qsl.to(device),
        seq_lens=torch.tensor(slens, dtype=torch.int32, device=device),
        block_tables=block_tables.to(device),
        slot_mapping=torch.tensor(slots, dtype=torch.int64, device=device),
        positions=pos,
        tree_mask=tree_mask,
        query_lens=qlens,
        seq_lens_host=slens,
    )
    return BatchInputs(
        input_ids=torch.tensor(ids, dtype=torch.int64, device=device),
        positions=pos,
        meta=meta,
        logits_index=torch.tensor(logits_index, dtype=torch.int64, device=device),
        logits_rows=logits_rows,
        token_rows=token_rows,
    )


@dataclass
class ForwardResult:
    logits: torch.Tensor  # [R, V] fp32, rows in feed order as requested
    hidden: torch.Tensor  # [T, H] final hidden states of every fed token
    aux_hidden: dict[int, torch.Tensor]  # layer -> [T, H]
    inputs: BatchInputs

    def feed_logits(self, i: int) -> torch.Tensor:
        r0, n = self.inputs.logits_rows[i]
        return self.logits[r0:r0 + n]


class CapturedForwards(Protocol):
    """Forwards recorded once and replayed (``hyspec.engine.step_graphs.StepGraphs``, which the engine builds)."""

    def key_for(self, query_lens: list[int], seq_lens: list[int], table_width: int, tree: bool,
                aux_layers: tuple[int, ...]) -> Hashable | None:
        """The recorded forward a step with these lengths replays, or None: it runs eagerly."""

    def run(self, key: Hashable, input_ids: torch.Tensor, meta: AttentionMetadata
            ) -> tuple[torch.Tensor, dict[int, torch.Tensor]] | None:
        """Final and aux hidden states of the step, or None when no more forwards may be recorded."""


class ModelRunner:
    """Runs a model over feeds on its KV layout.

    ``graphs``: captured forwards (hyspec.engine.step_graphs builds them); a step that fits
    one replays it.  None (a backend without a graph capturer, or
    ``enforce_eager``): every step runs eagerly.
    """

    def __init__(self, model, layout, device: torch.device, graphs: CapturedForwards | None = None):
        self.model = model
        self.layout = layout
        self.device = device
        self.graphs = graphs

    @torch.inference_mode()
    def run(self, feeds: list[Feed], aux_layers: tuple[int, ...] = ()) -> ForwardResult:
        inputs = build_inputs(feeds, self.device)
        captured = self._run_captured(inputs, aux_layers) if self.graphs is not None else None
        if captured is not None:
            hidden, aux_hidden = captured
        else:
            out = self.model(inputs.input_ids, inputs.positions, list(self.layout.caches), inputs.meta,
                             aux_layers=aux_layers)
            hidden, aux_hidden = out.hidden, out.aux_hidden
        logits = (self.model.compute_logits(hidden[inputs.logits_index])
                  if inputs.logits_index.numel() else hidden.new_zeros(0, 0).float())
        for f in feeds:
            f.kv.num_tokens = f.start + len(f.tokens)
        return ForwardResult(logits=logits, hidden=hidden, aux_hidden=aux_hidden, inputs=inputs)

    def _run_captured(self, inputs: BatchInputs, aux_layers: tuple[int, ...]
                      ) -> tuple[torch.Tensor, dict[int, torch.Tensor]] | None:
        meta = inputs.meta
        key = self.graphs.key_for(meta.query_lens, meta.seq_lens_host, meta.block_tables.shape[1],
                                  meta.tree_mask is not None, tuple(aux_layers))
        return None if key is None else self.graphs.run(key, inputs.input_ids, meta)
