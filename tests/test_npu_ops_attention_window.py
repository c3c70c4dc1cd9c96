"""Sliding-window attention on the NPU op table, on CPU through the emulated torch_npu.

A windowed step (decode, prefill, chain or tree) goes to FIA's explicit-mask call (BSND, sparse_mode 0) with the
window ANDed into the mask: ATB paged attention takes no mask, and FIA's pre_tokens / next_tokens have no effect
at Q_S = 1 and an undocumented anchoring in the band mode (hyspec.npu_ops.attention_args).  As the other NPU
tests, this shows the argument plumbing agrees with our reading of the docs, not that the kernels do: that needs
an Ascend machine (scripts/npu_first_contact.sh runs the windowed rungs there).
"""
from __future__ import annotations

import sys

import pytest
import torch

from hyspec.cuda_ops.cases import paged_attention_case
from hyspec.npu_ops.emulation import EmulationError, fake_torch_npu
from hyspec.npu_ops.layout import paged_cache
from hyspec.npu_ops.tolerances import tolerance
from hyspec.ops import reference_ops
from tests.test_npu_ops_attention import attention_op, called

REF = reference_ops()
FIA, PA = "npu_fused_infer_attention_score", "_npu_paged_attention"

# (context_lens, query_lens, block_size, tree); multi-row PageAttention takes block sizes that are multiples of 128
SCENARIOS = {
    "decode": ([70, 40, 5], [1, 1, 1], 16, False),
    "prefill": ([0, 120], [33, 20], 128, False),
    "tree": ([20, 170, 0], [8, 1, 13], 128, True),
    "big_tree": ([45, 2], [20, 40], 128, True),  # split into 16-row entries: the window follows each piece's rows
}


@pytest.fixture
def npu(monkeypatch):
    module = fake_torch_npu()
    monkeypatch.setitem(sys.modules, "torch_npu", module)
    return module


@pytest.mark.parametrize("window", [3, 20])
@pytest.mark.parametrize("scenario", SCENARIOS)
@pytest.mark.parametrize("head_dim", [64, 128], ids=["d64", "d128"])
def test_a_windowed_step_takes_the_masked_call_and_matches_the_reference(npu, scenario, window, head_dim) -> None:
    """3: inside one page; 20: straddles pages.  D = 128 would go to ATB PA (decode) or TND (causal) without a
    window: with one, every step is one explicit-mask FIA call."""
    ctx, qlens, block_size, tree = SCENARIOS[scenario]
    case = paged_attention_case(ctx, qlens, 9, 3, head_dim, block_size, torch.bfloat16, tree=tree, seed=window)
    op = attention_op(npu)
    expected = REF.attention(*case.args(), sliding_window=window)
    assert op.route(case.q, paged_cache(case.k_cache, case.v_cache), case.meta, window) == ("BSND", None)
    actual = op(*case.args(), sliding_window=window)
    tolerance("attention", torch.bfloat16).check(actual, expected, f"{scenario} window {window}")
    assert not called(npu, PA)
    assert [c["input_layout"] for c in called(npu, FIA)] == ["BSND"]
    assert all(c["sparse_mode"] == 0 and "pre_tokens" not in c for c in called(npu, FIA))


def test_a_window_past_every_sequence_keeps_the_unwindowed_routes(npu) -> None:
    """Eager steps whose sequences all fit in the window are the unwindowed maths: decode stays on ATB PA."""
    case = paged_attention_case([70, 40, 5], [1, 1, 1], 9, 3, 128, 16, torch.bfloat16, seed=1)
    actual = attention_op(npu)(*case.args(), sliding_window=1000)
    tolerance("attention", torch.bfloat16).check(actual, REF.attention(*case.args()), "decode, window 1000")
    assert called(npu, PA) and not called(npu, FIA)


def test_under_graph_capture_a_windowed_layer_keeps_the_masked_route(npu, monkeypatch) -> None:
    """A captured graph replays its route at every later length: a windowed layer must not be captured on PA
    while the context still fits the window.  (The capture itself is not run here: graph.capturing is
    patched, so the static-shape arguments are built and launched eagerly.)"""
    from hyspec.npu_ops import graph

    monkeypatch.setattr(graph, "capturing", lambda: True)
    case = paged_attention_case([70, 40, 5], [1, 1, 1], 9, 3, 128, 16, torch.bfloat16, seed=2)
    actual = attention_op(npu)(*case.args(), sliding_window=1000)
    tolerance("attention", torch.bfloat16).check(actual, REF.attention(*case.args()), "captured decode")
    assert not called(npu, PA) and [c["input_layout"] for c in called(npu, FIA)] == ["BSND"]


def test_without_a_documented_masked_layout_the_reference_runs_with_the_window(npu, caplog) -> None:
    op = attention_op(npu)
    op.layout_rules = {"TND": op.layout_rules["TND"]}  # a release documenting TND PageAttention only
    case = paged_attention_case([40, 130], [4, 1], 8, 2, 128, 128, torch.bfloat16, seed=3)
    actual = op(*case.args(), sliding_window=16)
    assert "only BSND's explicit mask carries it" in caplog.text
    assert torch.equal(actual, REF.attention(*case.args(), sliding_window=16))
    assert not npu.calls


def test_alternating_layers_share_nothing_but_the_step(npu) -> None:
    """Gemma-style alternation in one step: full, windowed, full, windowed -- each layer gets its own maths."""
    case = paged_attention_case([20, 170], [8, 5], 8, 2, 128, 128, torch.bfloat16, tree=True, seed=4)
    op = attention_op(npu)
    full, windowed = REF.attention(*case.args()), REF.attention(*case.args(), sliding_window=6)
    for window, expected in [(None, full), (6, windowed), (None, full), (6, windowed)]:
        tolerance("attention", torch.bfloat16).check(op(*case.args(), sliding_window=window), expected,
                                                     f"window {window}")


def test_a_bad_window_is_refused(npu) -> None:
    case = paged_attention_case([4], [1], 4, 2, 128, 16, torch.bfloat16)
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="sliding_window must be a positive integer"):
            attention_op(npu)(*case.args(), sliding_window=bad)


def test_the_emulation_applies_pre_and_next_tokens_only_as_documented(npu) -> None:
    """FIA's doc: pre_tokens / next_tokens do nothing at Q_S = 1, in sparse_mode 1/2/3 or without a mask; with a
    mask in sparse_mode 0, and in the band mode 4, the band's anchoring is not stated: refused, not guessed."""
    from hyspec.npu_ops.attention_args import causal_args, causal_mask

    case = paged_attention_case([0, 120], [33, 20], 8, 2, 128, 128, torch.bfloat16, seed=5)
    cache = paged_cache(case.k_cache, case.v_cache)
    args = causal_args(case.meta, cache)
    common = dict(block_table=args.block_table, input_layout="TND", actual_seq_lengths=args.actual_seq_lengths,
                  actual_seq_lengths_kv=args.actual_seq_lengths_kv, block_size=128, num_heads=8,
                  num_key_value_heads=2, scale=case.scale)
    q, key, value = case.q.contiguous(), cache.key_bsh(), cache.value_bsh()
    plain, _ = npu.npu_fused_infer_attention_score(q, key, value, atten_mask=causal_mask(q.device), sparse_mode=3,
                                                   **common)
    banded, _ = npu.npu_fused_infer_attention_score(q, key, value, atten_mask=causal_mask(q.device), sparse_mode=3,
                                                    pre_tokens=4, next_tokens=0, **common)
    assert torch.equal(plain, banded)  # sparse_mode 3 ignores the band
    with pytest.raises(EmulationError, match="band"):
        npu.npu_fused_infer_attention_score(q, key, value, atten_mask=causal_mask(q.device), sparse_mode=4,
                                            pre_tokens=4, next_tokens=0, **common)


def test_a_windowed_model_loads_on_the_npu_op_table(tmp_path) -> None:
    """_check_sliding_window_support lets the NPU attention op serve a windowed model (it refused it before).
    The emulated module stays out of sys.modules here: transformers probes for a real torch_npu."""
    from hyspec.model.loader import load_model
    from tests.model.hf_fixtures import make_hf_model

    make_hf_model("mistral_window", tmp_path, layers=2, seed=4)
    table = reference_ops().with_overrides("torch_npu", attention=attention_op(fake_torch_npu()))
    model = load_model(tmp_path, dtype="float32", ops=table)
    assert model.layers[0].self_attn.sliding_window == 8
