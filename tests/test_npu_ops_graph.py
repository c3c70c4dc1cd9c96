"""NPU graph keys and padding rules (CPU).  Capture and replay themselves need an Ascend device: not tested here."""
from __future__ import annotations

import math
import sys

import pytest
import torch

from hyspec.cuda_ops.cases import paged_attention_case
from hyspec.npu_ops.attention import NpuAttention
from hyspec.npu_ops.emulation import fake_torch_npu
from hyspec.npu_ops.op_schemas import PINNED_BRANCH, load_release
from hyspec.npu_ops.graph import GraphKey, NpuGraphRunner, ScratchPages, capturing, graph_key, pad_metadata
from hyspec.npu_ops.tolerances import tolerance
from hyspec.ops import reference_ops

REF = reference_ops()
PINNED = load_release(PINNED_BRANCH)


def case_with_scratch(ctx, qlens, tree=False, block_size=128):
    """D = 128 and 128-token blocks: FIA's documented PageAttention shapes for more than one query row."""
    case = paged_attention_case(ctx, qlens, 4, 2, 128, block_size, torch.bfloat16, tree=tree, seed=11)
    used = {int(p) for b, length in enumerate(case.meta.seq_lens_host)
            for p in case.meta.block_tables[b, :math.ceil(length / block_size)]}
    free = [p for p in range(case.pool.shape[0]) if p not in used]
    return case, ScratchPages(pages=tuple(free), block_size=block_size)


def test_graph_keys_bucket_uniform_steps_and_leave_the_rest_eager() -> None:
    decode = paged_attention_case([5, 9, 2], [1, 1, 1], 4, 2, 32, 16, torch.bfloat16).meta
    assert graph_key(decode) == GraphKey(batch=4, tokens_per_seq=1, tree=False)
    verify = paged_attention_case([5, 9], [4, 4], 4, 2, 32, 16, torch.bfloat16, tree=True).meta
    assert graph_key(verify, buckets=(1, 2, 8)) == GraphKey(batch=2, tokens_per_seq=4, tree=True)
    ragged = paged_attention_case([5, 9], [4, 1], 4, 2, 32, 16, torch.bfloat16).meta
    assert graph_key(ragged) is None
    assert graph_key(verify, max_tokens_per_seq=3) is None
    assert graph_key(decode, buckets=(1, 2)) is None
    assert not capturing()


@pytest.mark.parametrize("tree", [False, True], ids=["chain", "tree"])
def test_padding_sequences_change_no_real_output_and_write_only_scratch(monkeypatch, tree: bool) -> None:
    case, scratch = case_with_scratch([20, 3, 40], [3, 3, 3], tree=tree)
    key = GraphKey(batch=8, tokens_per_seq=3, tree=tree)
    padded = pad_metadata(case.meta, key, scratch)
    assert padded.num_seqs == 8 and padded.num_tokens == 24 and padded.query_lens == [3] * 8
    pad_slots = padded.slot_mapping[9:]
    assert len(set(pad_slots.tolist())) == 15  # distinct: npu_scatter_pa_kv_cache leaves duplicates undefined
    assert set((pad_slots // 128).tolist()) <= set(scratch.pages)
    q = torch.cat([case.q, torch.zeros(15, *case.q.shape[1:], dtype=case.q.dtype)])
    expected = REF.attention(case.q, case.k_cache, case.v_cache, case.meta, case.scale)
    padded_ref = REF.attention(q, case.k_cache, case.v_cache, padded, case.scale)
    assert torch.equal(padded_ref[:9], expected)
    module = fake_torch_npu()
    monkeypatch.setitem(sys.modules, "torch_npu", module)
    npu = NpuAttention(module.npu_fused_infer_attention_score, module._npu_paged_attention, limits=PINNED)
    tolerance("attention", torch.bfloat16).check(npu(q, case.k_cache, case.v_cache, padded, case.scale)[:9],
                                                 expected, "padded step on the NPU wrapper")
    before = case.pool.clone()
    k = torch.randn(24, 2, 128).to(torch.bfloat16)
    REF.write_kv(k, k, case.k_cache, case.v_cache, padded.slot_mapping)
    changed_pages = {int(p) for p in (case.pool != before).flatten(1).any(1).nonzero().flatten()}
    real_pages = {int(s) // 128 for s in case.meta.slot_mapping}
    assert changed_pages <= real_pages | set(scratch.pages)


def test_scratch_pages_must_hold_every_padding_token() -> None:
    with pytest.raises(ValueError, match="20 padding tokens need more than the 16 scratch slots"):
        ScratchPages(pages=(7,), block_size=16).slots(20)
    with pytest.raises(ValueError, match="at least one page"):
        ScratchPages(pages=(), block_size=16)


def test_pad_metadata_refuses_a_step_that_does_not_fit_the_key() -> None:
    case, scratch = case_with_scratch([4, 4], [2, 3])
    with pytest.raises(ValueError, match="does not fit graph"):
        pad_metadata(case.meta, GraphKey(batch=4, tokens_per_seq=2, tree=False), scratch)


def test_the_graph_runner_needs_torch_npu() -> None:
    if hasattr(torch, "npu"):
        pytest.skip("torch.npu exists here")
    with pytest.raises(RuntimeError, match="torch.npu.NPUGraph"):
        NpuGraphRunner(lambda meta, inputs: inputs["x"], ScratchPages(pages=(0,), block_size=16))


class FakeNpuGraphApi:
    """torch.npu's graph-task API as no-ops that record their order (no graph exists on CPU)."""

    def __init__(self) -> None:
        self.log: list[str] = []
        api = self

        class Event:
            def wait(self, stream): api.log.append("event.wait")
            def reset(self, stream): api.log.append("event.reset")
            def record(self, stream): api.log.append("event.record")

        self.ExternalEvent = Event

    def current_stream(self):
        return "capture-stream"

    def graph_task_group_begin(self, stream):
        self.log.append(f"group_begin {stream}")

    def graph_task_group_end(self, stream):
        self.log.append("group_end")
        return f"handle{self.log.count('group_end')}"

    def graph_task_update_begin(self, stream, handle):
        self.log.append(f"update_begin {stream} {handle}")

    def graph_task_update_end(self, stream):
        self.log.append("update_end")

    def stream(self, stream):
        import contextlib
        return contextlib.nullcontext()


@pytest.mark.parametrize("qlens", [[2, 2], [1, 1]], ids=["chain_fia", "decode_pa"])
def test_captured_attention_is_reissued_with_the_next_steps_lengths(monkeypatch, qlens) -> None:
    """Plumbing only: the emulated ops run eagerly, so 'update' recomputes into the captured output buffer."""
    import dataclasses

    from hyspec.npu_ops import graph

    module = fake_torch_npu()
    monkeypatch.setitem(sys.modules, "torch_npu", module)
    api = FakeNpuGraphApi()
    monkeypatch.setattr(torch, "npu", api, raising=False)
    case = paged_attention_case([5, 20], qlens, 4, 2, 128, 128, torch.bfloat16, seed=12)
    op = NpuAttention(module.npu_fused_infer_attention_score, module._npu_paged_attention, limits=PINNED)
    capture = graph._Capture()
    token = graph._active.set(capture)
    try:
        out = op(*case.args())
    finally:
        graph._active.reset(token)
    assert len(capture.launches) == 1 and api.log == ["event.wait", "event.reset", "group_begin capture-stream",
                                                      "group_end"]
    tolerance("attention", torch.bfloat16).check(out, REF.attention(*case.args()), "captured step")
    # next step: two more committed tokens per sequence, same pages (the tables already cover them)
    lens = [n + 2 for n in case.meta.seq_lens_host]
    step2 = dataclasses.replace(case.meta, seq_lens=torch.tensor(lens, dtype=torch.int32), seq_lens_host=lens)
    case.meta.seq_lens.copy_(step2.seq_lens)  # what the runner does to the static buffers before replay
    capture.update(step2, "update-stream")
    assert api.log[-3:] == ["update_begin update-stream handle1", "update_end", "event.record"]
    reissued = module.calls[-1]
    if qlens == [1, 1]:
        assert reissued[0] == "_npu_paged_attention" and reissued[2]["context_lens"].tolist() == lens
    else:
        assert reissued[0] == "npu_fused_infer_attention_score.out"
        assert reissued[2]["actual_seq_lengths_kv"] == lens and reissued[2]["actual_seq_lengths"] == [2, 4]
    tolerance("attention", torch.bfloat16).check(out, REF.attention(case.q, case.k_cache, case.v_cache, step2,
                                                                    case.scale), "updated step")
