"""Captured steps (hyspec.engine.step_graphs) checked where no GPU is.

The Triton op table runs under TRITON_INTERPRET=1 and a ReexecutingCapturer
stands in for the CUDA graph: every replay reruns the captured forward with
host reads and host-built tensors forbidden and must launch exactly the
kernels, grids and scalars of the capture.  A step that passes reads only its
static buffers, launches for fixed bounds and never syncs: what a recorded
CUDA graph needs.  The capture itself (torch.cuda.CUDAGraph) needs a GPU.
"""
from __future__ import annotations

import contextlib
import os

os.environ["TRITON_INTERPRET"] = "1"  # before the kernel modules import triton's jit

import pytest  # noqa: E402
import torch  # noqa: E402

pytest.importorskip("triton")

from hyspec.engine.step_graphs import GraphKey, StepGraphs, batch_buckets  # noqa: E402
from hyspec.graph_capture import GraphCaptureError, ReexecutingCapturer, host_read_guard  # noqa: E402
from hyspec.seam.forward import Feed, ModelRunner  # noqa: E402

triton_launches = pytest.importorskip("hyspec.cuda_ops.common").interpreter_launches


def test_batch_buckets() -> None:
    assert batch_buckets(1) == (1,)
    assert batch_buckets(12) == (1, 2, 4, 8, 12)
    assert batch_buckets(64, [8, 1, 8]) == (1, 8)
    with pytest.raises(ValueError, match="positive integers"):
        batch_buckets(4, [0, 2])


@pytest.fixture(scope="module")
def tiny_triton(tmp_path_factory):
    """The tiny target on the Triton op table, fp32 (so graph and eager agree to the attention's tolerance)."""
    from hyspec.backends.cpu import CPUBackend
    from hyspec.backends.probe import probe_cpu
    from hyspec.conformance.tiny import make_tiny_target
    from hyspec.cuda_ops import cuda_op_overrides
    from hyspec.model.loader import load_model

    table = CPUBackend(probe_cpu()).ops.with_overrides("triton", **cuda_op_overrides())
    return load_model(make_tiny_target(tmp_path_factory.mktemp("tiny")), dtype="float32", ops=table)


def test_steps_that_do_not_fit_run_eagerly_and_say_why(tiny_triton) -> None:
    graphs = StepGraphs(tiny_triton, [], ReexecutingCapturer(), block_size=16, max_len=64, batch_sizes=(1, 2, 4, 8),
                        max_query=8)
    assert graphs.key_for([1, 1, 1], [9, 30, 64], 4, False, ()) == GraphKey(4, 1, False, ())
    assert graphs.key_for([5, 1], [9, 30], 2, True, (3,)) == GraphKey(2, 8, True, (3,))
    assert graphs.key_for([1] * 9, [5] * 9, 1, False, ()) is None  # more sequences than the largest bucket
    assert graphs.key_for([9], [9], 1, False, ()) is None  # a chunk longer than the largest budget
    assert graphs.key_for([1], [65], 5, False, ()) is None  # past the length bound
    assert graphs.key_for([8] + [1] * 7, [20] * 8, 2, False, ()) is None  # 8 x 8 rows for 15 real ones
    assert graphs.stats.eager == {"batch": 1, "query": 1, "length": 1, "padding": 1}


def test_the_guard_refuses_host_reads_and_host_built_tensors() -> None:
    x = torch.ones(3)
    for read in (lambda: x.sum().item(), lambda: x.tolist(), lambda: bool(x[0]), lambda: int(x[0]),
                 lambda: torch.tensor([1, 2]), lambda: x.numpy()):
        with host_read_guard(), pytest.raises(GraphCaptureError):
            read()
    assert x.sum().item() == 3.0 and torch.tensor([1]).tolist() == [1]  # restored on exit


def test_a_replay_that_launches_differently_is_refused() -> None:
    grids = iter([1, 2])

    @contextlib.contextmanager
    def recorder():
        yield [next(grids)]

    replay, out = ReexecutingCapturer(recorder).capture(lambda: torch.zeros(2))
    with pytest.raises(GraphCaptureError, match="launched different"):
        replay()


def _runner(model, graphs_on: bool, block: int = 16):
    from hyspec.kv.pool import KVPool
    from hyspec.kv.sequence_kv import SequenceKV

    cfg = model.config
    pool = KVPool(48, KVPool.page_bytes_for(cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim,
                                            torch.float32, block))
    layout = pool.register("target", cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim, torch.float32,
                           block)
    graphs = None
    if graphs_on:
        graphs = StepGraphs(model, list(layout.caches), ReexecutingCapturer(triton_launches), block_size=block,
                            max_len=128, batch_sizes=batch_buckets(4), max_query=8)
    runner = ModelRunner(model, layout, torch.device("cpu"), graphs=graphs)
    return runner, [SequenceKV(pool, layout) for _ in range(3)]


def _steps():
    """(tokens per sequence, tree masks per sequence or None) for prefill, decodes, a chain and a tree."""
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, 200, (n,), generator=g).tolist() for n in (21, 9, 14)]
    yield prompts, None  # prefill: 21 > the largest budget (8), eager
    for _ in range(3):
        yield [torch.randint(3, 200, (1,), generator=g).tolist() for _ in range(3)], None  # decode, bucket 4 x 1
    yield [torch.randint(3, 200, (n,), generator=g).tolist() for n in (4, 2)], None  # chains of 2 seqs, 2 x 4
    tree = torch.tensor([[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 0, 1, 0, 0], [1, 1, 0, 1, 0], [1, 0, 1, 0, 1]],
                        dtype=torch.bool)
    yield [torch.randint(3, 200, (5,), generator=g).tolist() for _ in range(3)], [tree, None, tree]


def test_captured_steps_match_eager_and_replay_the_capture(tiny_triton) -> None:
    """Prefill (eager), three decodes, chains and a tree through graphs, against the same steps eagerly: the
    same logits to the fp32 attention tolerance, the same argmax, and every replay launched as its capture."""
    eager, eager_kv = _runner(tiny_triton, graphs_on=False)
    graphed, graphed_kv = _runner(tiny_triton, graphs_on=True)
    for tokens, trees in _steps():
        results = []
        for runner, kvs in ((eager, eager_kv), (graphed, graphed_kv)):
            feeds = []
            for i, toks in enumerate(tokens):
                kv = kvs[i]
                kv.reserve(kv.num_tokens + len(toks))
                mask = trees[i] if trees is not None else None
                depths = None if mask is None else (mask.sum(1) - 1).tolist()
                feeds.append(Feed(kv=kv, tokens=toks, start=kv.num_tokens, depths=depths, tree_mask=mask))
            results.append(runner.run(feeds))
        ours, theirs = results[1], results[0]
        torch.testing.assert_close(ours.logits, theirs.logits, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(ours.hidden, theirs.hidden, atol=1e-5, rtol=1e-5)
        assert torch.equal(ours.logits.argmax(-1), theirs.logits.argmax(-1))
        for kv_g, kv_e in zip(graphed_kv, eager_kv):
            assert kv_g.num_tokens == kv_e.num_tokens
    stats = graphed.graphs.stats
    assert set(graphed.graphs.graphs) == {GraphKey(4, 1, False, ()), GraphKey(2, 4, False, ()),
                                          GraphKey(4, 8, True, ())}
    assert stats.replays == 5 and stats.eager == {"query": 1}
    assert graphed.graphs.capturer.replays == 5  # each replay reran the forward and matched the capture's launches


def test_padding_rows_write_no_kv(tiny_triton) -> None:
    """A bucket-4 decode of 3 sequences writes the 3 real slots and nothing else of the pool."""
    runner, kvs = _runner(tiny_triton, graphs_on=True)
    caches = runner.layout.caches
    for kv in kvs:
        kv.reserve(1)
    before = [c.clone() for pair in caches for c in pair]
    runner.run([Feed(kv=kv, tokens=[5], start=0) for kv in kvs])
    slots = {kv.pages[0] * 16 for kv in kvs}
    for old, new in zip(before, (c for pair in caches for c in pair)):
        changed = (old != new).flatten(2).any(-1)  # [pages, offsets]
        written = {int(p) * 16 + int(o) for p, o in changed.nonzero()}
        assert written <= slots


def _engine_on_triton(model_dir, monkeypatch, graphs: bool, **kwargs):
    """An LLM on the CPU backend carrying the Triton table (as conformance's interpreter target builds it),
    whose capturer is the re-executing one with the launch check when ``graphs``."""
    from hyspec import LLM
    from hyspec.backends import registry
    from hyspec.backends.cpu import CPUBackend
    from hyspec.backends.probe import probe_cpu
    from hyspec.cuda_ops import cuda_op_overrides

    backend = CPUBackend(probe_cpu())
    backend.ops = backend.ops.with_overrides("triton", **cuda_op_overrides())
    backend.graph_capturer = lambda: ReexecutingCapturer(triton_launches)
    monkeypatch.setattr(registry, "get_backend", lambda name=None: backend)
    return LLM(str(model_dir), dtype="float32", kv_cache_bytes=4 << 20, max_model_len=200,
               enforce_eager=not graphs, **kwargs)


@pytest.mark.parametrize("method", ["plain", "ngram", "draft_model"])
def test_generate_through_graphs_equals_eager(tmp_path, monkeypatch, method) -> None:
    """LLM.generate, greedy, with steps captured and without: the same tokens (plain decoding, ngram's
    verification chains on prompts that repeat, and the target drafting for itself through draft_model, whose
    own decode steps replay graphs too), and the steps went through graphs."""
    from hyspec import SamplingParams
    from hyspec.conformance.tiny import make_tiny_target

    model_dir = make_tiny_target(tmp_path / "tiny")
    off = {"controller": {"enabled": False, "profile_at_startup": False}}
    spec = {"plain": None,
            "ngram": {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1,
                      "prompt_lookup_max": 3, **off},
            "draft_model": {"method": "draft_model", "model": str(model_dir), "num_speculative_tokens": 3,
                            **off}}[method]
    motif = [7, 19, 33, 41, 5]
    prompts = [motif * 4, [3, 9, 27, 81, 11, 12], motif * 2 + [60, 61]]
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    outputs = {}
    for graphs in (False, True):
        llm = _engine_on_triton(model_dir, monkeypatch, graphs, speculative_config=spec)
        try:
            outputs[graphs] = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
            stats = llm.engine.graph_stats
            drafter = llm.engine.spec.proposers.get("draft_model") if spec is not None else None
            draft_graphs = drafter.runner.graphs if drafter is not None else None
        finally:
            llm.close()
        if graphs:
            assert stats["replays"] > 0 and stats["captures"] >= 1
            if drafter is not None:
                assert draft_graphs is not None and draft_graphs.stats.replays > 0
        else:
            assert stats is None and draft_graphs is None
    assert outputs[True] == outputs[False]


def test_engine_options_for_graphs_are_checked(tiny_ckpt) -> None:
    from hyspec import LLM
    from hyspec.errors import ConfigError

    with pytest.raises(ConfigError, match="enforce_eager"):
        LLM(str(tiny_ckpt[0]), dtype="float32", kv_cache_bytes=8 << 20, enforce_eager="yes")
    with pytest.raises(ConfigError, match="cuda_graph_sizes.*positive integers"):
        LLM(str(tiny_ckpt[0]), dtype="float32", kv_cache_bytes=8 << 20, cuda_graph_sizes=[0, 4])
    llm = LLM(str(tiny_ckpt[0]), dtype="float32", kv_cache_bytes=8 << 20, backend="cpu")
    try:
        assert llm.engine.graph_stats is None  # the CPU backend has no capturer: every step is eager
    finally:
        llm.close()
