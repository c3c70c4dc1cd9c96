"""NPU graph capture and replay of decode and verify steps (``torch.npu.NPUGraph``).

NOT EXECUTED: the capture/replay half of this module has never run (no
Ascend device was available); only the keying and padding rules are tested,
on CPU.  It follows the pattern documented for torch_npu
(``torch_npu.npu.graph_task_group_begin`` / ``graph_task_update_begin``
examples in op-plugin docs) and used by vllm-ascend's ACL graphs.

Which steps are captured.  Every sequence has the same number ``n`` of query
tokens (``n = 1``: decode; ``n = k + 1``: chain or tree verification) and the
batch is padded up to a bucket, so a graph is keyed by ``GraphKey(batch,
tokens_per_seq, tree)``.  Prefill and ragged steps run eagerly.

Padding rules (``pad_metadata``): each padding sequence has ``n`` query
tokens and no context (``seq_len = n``), token id 0, positions ``0..n-1``, a
causal tree mask, block-table rows pointing at a scratch page, and slots in
scratch pages -- distinct slots, because ``npu_scatter_pa_kv_cache`` does
not define duplicate writes.  The KV pool must reserve those scratch pages
(nobody reads them); their outputs are dropped.

Why attention needs more than replay.  FIA's ``actual_seq_lengths_kv`` and
PA's ``context_lens`` are host values baked into the captured task, and
change every step.  Each attention launch is therefore captured as a task
group (``graph_task_group_begin/end``) with a workspace sized by
``_npu_*_get_workspace``, and re-issued with the new lengths on a side stream
between ``graph_task_update_begin/end`` before ``replay()``.  Everything else
the attention wrapper computes (scaled block tables, tree masks) is device
work on static buffers and replays as captured.
"""
from __future__ import annotations

import contextvars
import dataclasses
from dataclasses import dataclass
from typing import Callable

import torch

from hyspec.ops.attention import AttentionMetadata

DEFAULT_BATCH_BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128)
MAX_GRAPH_TOKENS_PER_SEQ = 16

_active: contextvars.ContextVar["_Capture | None"] = contextvars.ContextVar("hyspec_npu_capture", default=None)


def capturing() -> bool:
    return _active.get() is not None


def active_capture() -> "_Capture | None":
    return _active.get()


@dataclass(frozen=True)
class GraphKey:
    batch: int  # padded number of sequences (a bucket)
    tokens_per_seq: int  # query tokens of every sequence
    tree: bool  # verified against a tree mask (another FIA call than the causal one)


def graph_key(meta: AttentionMetadata, buckets: tuple[int, ...] = DEFAULT_BATCH_BUCKETS,
              max_tokens_per_seq: int = MAX_GRAPH_TOKENS_PER_SEQ) -> GraphKey | None:
    """The graph that serves this step, or None when it must run eagerly (ragged, too big, a prefill)."""
    n = meta.query_lens[0]
    if any(q != n for q in meta.query_lens) or n > max_tokens_per_seq or meta.num_seqs > max(buckets):
        return None
    batch = min(b for b in buckets if b >= meta.num_seqs)
    return GraphKey(batch=batch, tokens_per_seq=n, tree=meta.tree_mask is not None and n > 1)


@dataclass(frozen=True)
class ScratchPages:
    """Pool pages reserved for padding tokens' KV writes."""

    pages: tuple[int, ...]
    block_size: int

    def __post_init__(self) -> None:
        if not self.pages or self.block_size < 1:
            raise ValueError("ScratchPages needs at least one page and a positive block_size")

    def slots(self, count: int) -> list[int]:
        capacity = len(self.pages) * self.block_size
        if count > capacity:
            raise ValueError(f"{count} padding tokens need more than the {capacity} scratch slots reserved")
        return [self.pages[i // self.block_size] * self.block_size + i % self.block_size for i in range(count)]


def pad_metadata(meta: AttentionMetadata, key: GraphKey, scratch: ScratchPages) -> AttentionMetadata:
    """``meta`` with ``key.batch - num_seqs`` padding sequences appended (rules: module docstring)."""
    pads, n = key.batch - meta.num_seqs, key.tokens_per_seq
    if pads < 0 or any(q != n for q in meta.query_lens):
        raise ValueError(f"step with query lens {meta.query_lens} does not fit graph {key}")
    if pads == 0:
        return meta
    dev = meta.slot_mapping.device
    start = int(meta.query_start_loc[-1]) if meta.query_start_loc.numel() else 0
    qsl = torch.cat([meta.query_start_loc, torch.arange(1, pads + 1, device=dev, dtype=meta.query_start_loc.dtype)
                     * n + start])
    width = meta.block_tables.shape[1]
    pad_table = torch.full((pads, width), scratch.pages[0], dtype=meta.block_tables.dtype, device=dev)
    tree = meta.tree_mask
    if tree is not None:
        causal = torch.ones(n, n, dtype=torch.bool, device=tree.device).tril()
        tree = torch.cat([tree, causal.repeat(pads, 1)])
    return dataclasses.replace(
        meta,
        query_start_loc=qsl,
        seq_lens=torch.cat([meta.seq_lens, torch.full((pads,), n, dtype=meta.seq_lens.dtype, device=dev)]),
        block_tables=torch.cat([meta.block_tables, pad_table]),
        slot_mapping=torch.cat([meta.slot_mapping, torch.tensor(scratch.slots(pads * n), dtype=torch.int64,
                                                                 device=dev)]),
        positions=torch.cat([meta.positions, torch.arange(n, device=dev, dtype=meta.positions.dtype).repeat(pads)]),
        tree_mask=tree,
        query_lens=[*meta.query_lens, *[n] * pads],
        seq_lens_host=[*meta.seq_lens_host, *[n] * pads],
    )


@dataclass
class _Launch:
    """One captured attention call and how to re-issue it with a new step's host lengths."""

    run: Callable  # the .out variant
    args: tuple
    kwargs: dict
    refresh: Callable[[AttentionMetadata], dict]  # new step's metadata -> the kwargs that change
    handle: object
    event: object


class _Capture:  # NOT EXECUTED (see the module docstring)
    def __init__(self) -> None:
        self.launches: list[_Launch] = []

    def _grouped(self, run: Callable, args: tuple, kwargs: dict, refresh: Callable) -> None:
        npu = torch.npu
        stream = npu.current_stream()
        event = npu.ExternalEvent()
        event.wait(stream)
        event.reset(stream)
        npu.graph_task_group_begin(stream)
        run(*args, **kwargs)
        handle = npu.graph_task_group_end(stream)
        self.launches.append(_Launch(run, args, kwargs, refresh, handle, event))

    def launch_fia(self, fia: Callable, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, kwargs: dict,
                   refresh: Callable[[AttentionMetadata], dict]) -> torch.Tensor:
        import torch_npu

        workspace = torch_npu._npu_fused_infer_attention_score_get_max_workspace(query, key, value, **kwargs)
        out = torch.empty_like(query)
        lse = torch.empty(1, dtype=query.dtype, device=query.device)
        self._grouped(fia.out, (query, key, value), dict(kwargs, workspace=workspace, out=[out, lse]), refresh)
        return out

    def launch_paged_attention(self, paged_attention: Callable, kwargs: dict,
                               refresh: Callable[[AttentionMetadata], dict]) -> torch.Tensor:
        import torch_npu

        out = torch.empty_like(kwargs["query"])
        workspace = torch_npu._npu_paged_attention_get_workspace(**kwargs, out=out)
        self._grouped(paged_attention, (), dict(kwargs, out=out, workspace=workspace), refresh)
        return out

    def update(self, meta: AttentionMetadata, update_stream: object) -> None:
        npu = torch.npu
        with npu.stream(update_stream):
            for launch in self.launches:
                npu.graph_task_update_begin(update_stream, launch.handle)
                launch.run(*launch.args, **dict(launch.kwargs, **launch.refresh(meta)))
                npu.graph_task_update_end(update_stream)
                launch.event.record(update_stream)


class NpuGraphRunner:  # NOT EXECUTED (see the module docstring)
    """Replays ``forward(meta, inputs) -> [T, ...]`` from NPU graphs keyed by ``GraphKey``.

    ``inputs`` are per-token tensors (``input_ids``, ...) of the unpadded
    step; padding tokens get zeros.  Returns None when the step must run
    eagerly.  Keep one runner per model: graphs capture that model's layers.
    """

    def __init__(self, forward: Callable[[AttentionMetadata, dict[str, torch.Tensor]], torch.Tensor],
                 scratch: ScratchPages, buckets: tuple[int, ...] = DEFAULT_BATCH_BUCKETS,
                 max_tokens_per_seq: int = MAX_GRAPH_TOKENS_PER_SEQ):
        if not hasattr(torch, "npu") or not hasattr(torch.npu, "NPUGraph"):
            raise RuntimeError("NPU graphs need torch_npu (torch.npu.NPUGraph); import torch_npu first")
        self.forward, self.scratch = forward, scratch
        self.buckets, self.max_tokens_per_seq = tuple(sorted(buckets)), max_tokens_per_seq
        self._graphs: dict[GraphKey, tuple] = {}
        self._update_stream = torch.npu.Stream()  # updates must run on another stream than the graph's

    def __call__(self, meta: AttentionMetadata, inputs: dict[str, torch.Tensor]) -> torch.Tensor | None:
        key = graph_key(meta, self.buckets, self.max_tokens_per_seq)
        if key is None:
            return None
        padded = pad_metadata(meta, key, self.scratch)
        padded_inputs = {name: _pad_rows(t, padded.num_tokens) for name, t in inputs.items()}
        if key not in self._graphs:
            self._graphs[key] = self._capture(padded, padded_inputs)
        graph, static_meta, static_inputs, out, capture = self._graphs[key]
        if static_meta.block_tables.shape != padded.block_tables.shape:
            return None  # another table width than captured: run eagerly
        for name in ("query_start_loc", "seq_lens", "block_tables", "slot_mapping", "positions", "tree_mask"):
            src = getattr(padded, name)
            if src is not None:
                getattr(static_meta, name).copy_(src)
        for name, t in padded_inputs.items():
            static_inputs[name].copy_(t)
        capture.update(padded, self._update_stream)
        graph.replay()
        return out[:meta.num_tokens]

    def _capture(self, meta: AttentionMetadata, inputs: dict[str, torch.Tensor]) -> tuple:
        static_meta = dataclasses.replace(meta, **{
            name: getattr(meta, name).clone() for name in
            ("query_start_loc", "seq_lens", "block_tables", "slot_mapping", "positions", "tree_mask")
            if getattr(meta, name) is not None})
        static_inputs = {name: t.clone() for name, t in inputs.items()}
        self.forward(static_meta, static_inputs)  # warm-up: builds the cached index tensors outside the capture
        graph, capture = torch.npu.NPUGraph(), _Capture()
        token = _active.set(capture)
        try:
            with torch.npu.graph(graph):
                out = self.forward(static_meta, static_inputs)
        finally:
            _active.reset(token)
        return graph, static_meta, static_inputs, out, capture


def _pad_rows(t: torch.Tensor, rows: int) -> torch.Tensor:
    if t.shape[0] == rows:
        return t
    return torch.cat([t, t.new_zeros((rows - t.shape[0], *t.shape[1:]))])
