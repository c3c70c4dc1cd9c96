"""The ``draft_model`` drafter in ONNX Runtime: export (cached beside the drafter) and an incremental runner.

Export: :func:`export_draft_model` turns a drafter directory (a Hugging Face
Llama-family checkpoint, as ``hyspec train-draft --method draft_model``
writes) into the graph of :mod:`hyspec.cpu_ops.kv_graph`, always in fp32
(CPU ONNX Runtime's fast path; a bf16 checkpoint is upcast).
:func:`cached_export` keeps it as ``<drafter>/onnx/model-<hash>.onnx``, the
hash being the SHA-256 of the drafter's config and weights, so a file made
from other weights is never used; when the drafter folder is read-only the
file goes to ``$HYSPEC_CACHE`` (default ``~/.cache/hyspec``)/onnx/.

Running: :class:`OnnxDraftModel` is batched.  A :class:`DraftState` holds the
KV of B rows; :meth:`~OnnxDraftModel.prefill` starts B rows from their
prompts (ragged), :meth:`~OnnxDraftModel.step` appends one token per row,
:meth:`~OnnxDraftModel.feed` appends a ragged chunk per row (catch-up after
verification), and :meth:`~OnnxDraftModel.rollback` forgets each row's tail
(rejected drafts).  Rows of one state advance together; one sequence per
state (B = 1) is the simplest use, e.g. in a remote draft worker.

Rows are right-padded: a row's shorter chunk leaves masked holes in the
cache, and rolled-back entries are masked too, so every row keeps its own
positions; holes are squeezed out when they outnumber the live entries.
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from hyspec.cpu_ops.kv_graph import KVCacheLM, graph_io_names
from hyspec.cpu_ops.onnx_export import (DEFAULT_OPSET, export_onnx, files_fingerprint, read_metadata,
                                        write_atomically)
from hyspec.cpu_ops.onnx_runtime import OnnxModule
from hyspec.errors import CheckpointError, HyspecError

log = logging.getLogger(__name__)

META_WEIGHTS = "hyspec.weights_sha256"
META_KIND = "hyspec.graph"
GRAPH_KIND = "causal_lm_kv/1"  # bump when the graph's inputs or outputs change: old files are then stale


def drafter_fingerprint(model_dir: str | Path) -> str:
    """SHA-256 of the drafter's ``config.json`` and ``*.safetensors`` files."""
    model_dir = Path(model_dir)
    files = [model_dir / "config.json", *sorted(model_dir.glob("*.safetensors"))]
    missing = [f.name for f in files if not f.is_file()]
    if missing or len(files) < 2:
        raise CheckpointError(f"{model_dir} is not a drafter checkpoint: needs config.json and *.safetensors"
                              + (f" (missing {missing})" if missing else ""))
    return files_fingerprint(files)


def export_draft_model(model_dir: str | Path, out_path: str | Path | None = None, *, exporter: str = "torchscript",
                       opset: int = DEFAULT_OPSET) -> bytes:
    """The drafter in ``model_dir`` as ONNX bytes (also written to ``out_path`` when given)."""
    from hyspec.model.loader import load_model

    model_dir = Path(model_dir)
    fingerprint = drafter_fingerprint(model_dir)
    model = load_model(model_dir, dtype="float32")
    data = export_causal_lm(model, exporter=exporter, opset=opset,
                            metadata={META_WEIGHTS: fingerprint, META_KIND: GRAPH_KIND})
    if out_path is not None:
        write_atomically(data, Path(out_path))
    return data


def export_causal_lm(model, *, exporter: str = "torchscript", opset: int = DEFAULT_OPSET,
                     metadata: dict[str, str] | None = None) -> bytes:
    """Any hyspec ``CausalLM`` (in memory) as the KV-cache graph's ONNX bytes."""
    graph = KVCacheLM(model)
    cfg = model.config
    inputs, outputs = graph_io_names(cfg.num_hidden_layers)
    B, S, P = 2, 3, 2  # example sizes; every one of them is a dynamic axis
    example = (
        torch.zeros(B, S, dtype=torch.int64), torch.arange(P, P + S).repeat(B, 1), torch.ones(B, P + S, dtype=torch.int64),
        torch.full((B,), S - 1, dtype=torch.int64),
        *[torch.zeros(B, cfg.num_key_value_heads, P, cfg.head_dim) for _ in range(2 * cfg.num_hidden_layers)],
    )
    axes = {"input_ids": {0: "batch", 1: "new"}, "position_ids": {0: "batch", 1: "new"},
            "attention_mask": {0: "batch", 1: "total"}, "logits_index": {0: "batch"}, "logits": {0: "batch"}}
    axes.update({name: {0: "batch", 2: "past"} for name in inputs[4:]})
    axes.update({name: {0: "batch", 2: "total"} for name in outputs[1:]})
    meta = {META_KIND: GRAPH_KIND, "hyspec.config.vocab_size": str(cfg.vocab_size), **(metadata or {})}
    return export_onnx(graph, example, inputs, outputs, axes, metadata=meta, exporter=exporter, opset=opset)


def _cache_root() -> Path:
    return Path(os.environ.get("HYSPEC_CACHE") or Path.home() / ".cache" / "hyspec") / "onnx"


def cached_export(model_dir: str | Path, *, exporter: str = "torchscript") -> Path:
    """Path of an up-to-date export of ``model_dir`` (exported now if there is none or it is stale)."""
    model_dir = Path(model_dir)
    fingerprint = drafter_fingerprint(model_dir)
    name = f"model-{fingerprint[:16]}.onnx"
    candidates = [model_dir / "onnx" / name, _cache_root() / name]
    for path in candidates:
        if path.is_file() and _is_current(path, fingerprint):
            return path
    data = None
    for path in candidates:
        if data is None:
            data = export_draft_model(model_dir, exporter=exporter)
        try:
            write_atomically(data, path)
        except OSError as exc:  # a read-only install: try the user cache next
            log.info("cannot write the ONNX export to %s (%s)", path, exc)
            continue
        _remove_stale(path.parent, keep=path)
        return path
    raise HyspecError(f"cannot write the ONNX export of {model_dir} to {candidates[0].parent} or "
                      f"{candidates[1].parent}; set HYSPEC_CACHE to a writable folder")


def _is_current(path: Path, fingerprint: str) -> bool:
    try:
        meta = read_metadata(path)
    except HyspecError:
        return False
    return meta.get(META_WEIGHTS) == fingerprint and meta.get(META_KIND) == GRAPH_KIND


def _remove_stale(folder: Path, keep: Path) -> None:
    """Other exports of this drafter folder were made from older weights: nothing can use them."""
    if folder == _cache_root():
        return  # the shared user cache holds other drafters' exports too
    for old in folder.glob("model-*.onnx"):
        if old != keep:
            old.unlink(missing_ok=True)


@dataclass
class DraftState:
    """The KV of B rows.  Column c of row b holds the token at ``positions[b, c]`` when ``mask[b, c]``."""

    past: list[np.ndarray]  # 2 * num_layers arrays [B, Hkv, C, D] fp32 (key, value per layer)
    mask: np.ndarray  # [B, C] int64, 1 = live entry
    positions: np.ndarray  # [B, C] int64 RoPE position of each column, -1 = hole
    lengths: np.ndarray  # [B] int64 live tokens per row = the next position

    def __post_init__(self) -> None:
        B, C = self.mask.shape
        if self.positions.shape != (B, C) or self.lengths.shape != (B,):
            raise HyspecError(f"DraftState: mask {self.mask.shape}, positions {self.positions.shape} and lengths "
                              f"{self.lengths.shape} disagree")
        if any(p.shape[0] != B or p.shape[2] != C for p in self.past):
            raise HyspecError(f"DraftState: cache shapes {[p.shape for p in self.past[:2]]} != batch {B}, columns {C}")

    @property
    def batch_size(self) -> int:
        return int(self.mask.shape[0])

    @property
    def num_columns(self) -> int:
        return int(self.mask.shape[1])


class OnnxDraftModel:
    """An exported ``draft_model`` drafter in ONNX Runtime (CPU), used incrementally.

    ``source`` is an ``.onnx`` path or its bytes (from :func:`export_draft_model`
    or :func:`cached_export`).  Logits come back as torch fp32 ``[B, V]``.
    """

    def __init__(self, source: str | Path | bytes, num_threads: int | None = None, *, spin: bool = False):
        self.module = OnnxModule(source, num_threads, spin=spin)
        meta = self.module.metadata
        if meta.get(META_KIND) != GRAPH_KIND:
            raise HyspecError(f"{source if not isinstance(source, bytes) else 'the ONNX bytes'} is not a hyspec "
                              f"draft-model graph ({META_KIND}={meta.get(META_KIND)!r}, expected {GRAPH_KIND!r}); "
                              "re-export it with hyspec.cpu_ops.onnx_drafter.export_draft_model")
        self.vocab_size = int(meta["hyspec.config.vocab_size"])
        self.weights_sha256 = meta.get(META_WEIGHTS)
        past = [shape for name, shape in self.module.input_shapes.items() if name.startswith("past_key_")]
        self.num_layers = len(past)
        self.num_kv_heads, self.head_dim = int(past[0][1]), int(past[0][3])

    @classmethod
    def from_drafter_dir(cls, model_dir: str | Path, num_threads: int | None = None, **kw) -> "OnnxDraftModel":
        """Export ``model_dir`` (or reuse its up-to-date cached export) and load it."""
        return cls(cached_export(model_dir), num_threads, **kw)

    def set_num_threads(self, num_threads: int | None) -> None:
        self.module.set_num_threads(num_threads)

    def empty_state(self, batch_size: int) -> DraftState:
        shape = (batch_size, self.num_kv_heads, 0, self.head_dim)
        return DraftState(past=[np.zeros(shape, np.float32) for _ in range(2 * self.num_layers)],
                          mask=np.zeros((batch_size, 0), np.int64), positions=np.zeros((batch_size, 0), np.int64),
                          lengths=np.zeros(batch_size, np.int64))

    def prefill(self, prompts: Sequence[Sequence[int]]) -> tuple[torch.Tensor, DraftState]:
        """Start one row per prompt; logits ``[B, V]`` after each prompt's last token."""
        return self.feed(prompts, self.empty_state(len(prompts)))

    def step(self, tokens: Sequence[int] | torch.Tensor, state: DraftState) -> tuple[torch.Tensor, DraftState]:
        """Append one token per row; logits ``[B, V]`` after it."""
        ids = torch.as_tensor(tokens).reshape(-1).tolist()
        return self.feed([[t] for t in ids], state)

    def feed(self, chunks: Sequence[Sequence[int]], state: DraftState) -> tuple[torch.Tensor, DraftState]:
        """Append ``chunks[b]`` (at least one token) to row b; logits ``[B, V]`` after each row's last token."""
        B = state.batch_size
        if len(chunks) != B:
            raise HyspecError(f"feed: {len(chunks)} chunks for a state of {B} rows")
        lens = [len(c) for c in chunks]
        if min(lens, default=0) < 1:
            raise HyspecError("feed: every row needs at least one new token (use a state per sequence "
                              "when rows advance separately)")
        S = max(lens)
        ids = np.zeros((B, S), np.int64)
        new_mask = np.zeros((B, S), np.int64)
        for b, chunk in enumerate(chunks):
            row = np.asarray(chunk, dtype=np.int64)
            if row.min() < 0 or row.max() >= self.vocab_size:
                raise HyspecError(f"feed: row {b} has token ids outside [0, {self.vocab_size})")
            ids[b, :len(row)] = row
            new_mask[b, :len(row)] = 1
        new_pos = np.where(new_mask == 1, state.lengths[:, None] + np.arange(S)[None, :], -1)
        mask = np.concatenate([state.mask, new_mask], axis=1)
        feed = {"input_ids": ids, "position_ids": np.maximum(new_pos, 0), "attention_mask": mask,
                "logits_index": np.asarray(lens, np.int64) - 1}
        names = self.module.input_names
        feed.update({name: past for name, past in zip(names[4:], state.past)})
        logits, *present = self.module.run_numpy(feed)
        new_state = DraftState(past=present, mask=mask, positions=np.concatenate([state.positions, new_pos], axis=1),
                               lengths=state.lengths + np.asarray(lens, np.int64))
        return torch.from_numpy(logits), _squeezed(new_state)

    def rollback(self, state: DraftState, lengths: Sequence[int]) -> DraftState:
        """Keep the first ``lengths[b]`` tokens of row b (e.g. drop rejected drafts)."""
        keep = np.asarray(lengths, np.int64)
        if keep.shape != (state.batch_size,) or (keep < 0).any() or (keep > state.lengths).any():
            raise HyspecError(f"rollback: lengths {keep.tolist()} must be per row and <= {state.lengths.tolist()}")
        drop = state.positions >= keep[:, None]
        mask = np.where(drop, 0, state.mask)
        positions = np.where(drop, -1, state.positions)
        return _squeezed(DraftState(past=state.past, mask=mask, positions=positions, lengths=keep.copy()))


def _squeezed(state: DraftState) -> DraftState:
    """Drop the holes once they are the majority of columns (attention cost grows with columns, not tokens)."""
    live_per_row = state.mask.sum(axis=1)
    width = int(live_per_row.max()) if live_per_row.size else 0
    if state.num_columns <= 2 * max(width, 8):
        return state
    B = state.batch_size
    order = np.argsort(-state.mask, axis=1, kind="stable")[:, :width]  # live columns first, in order
    rows = np.arange(B)[:, None]
    past = [np.ascontiguousarray(p[rows, :, order].transpose(0, 2, 1, 3)) for p in state.past]
    return DraftState(past=past, mask=state.mask[rows, order], positions=state.positions[rows, order],
                      lengths=state.lengths.copy())


__all__ = ["DraftState", "OnnxDraftModel", "cached_export", "drafter_fingerprint", "export_causal_lm",
           "export_draft_model"]
