"""Teacher-forced identity and the measured near-tie rule (hyspec.numerics, hyspec.conformance.identity)."""
from __future__ import annotations

import pytest
import torch

from hyspec import LLM, SamplingParams
from hyspec.conformance.identity import excess_near_ties, judge_outputs, measure_rule, reference_logits
from hyspec.conformance.tiny import prompts
from hyspec.numerics import (MARGIN, IdentityReport, NearTieRule, judge_teacher_forced, rounding_deltas,
                             tolerance_for)


def rule(bound: float) -> NearTieRule:
    return NearTieRule(bound=bound, measured=bound / 4, positions=1, dtype=torch.float32)


def test_every_position_is_judged_and_comparison_goes_on_past_a_flip():
    ref = torch.tensor([[5.0, 1.0, 0.0],  # argmax 0; token 0: agree
                        [1.0, 3.0, 2.99],  # argmax 1; token 2: a flip at gap 0.01 (near-tie)
                        [0.0, 0.0, 9.0],  # argmax 2; token 2: agree
                        [4.0, 2.0, 0.0]])  # argmax 0; token 1: a flip at gap 2 (mismatch)
    report = judge_teacher_forced(ref, [0, 2, 2, 1], rule(0.05), sequence=3)
    assert report.positions == 4
    assert [(f.position, f.expected, f.actual) for f in report.flips] == [(1, 1, 2), (3, 0, 1)]
    assert [f.sequence for f in report.flips] == [3, 3]
    assert report.near_ties[0].gap == pytest.approx(0.01, abs=1e-6)
    assert [f.position for f in report.mismatches] == [3] and not report.passed
    assert "4 positions compared, 1 near-ties accepted, 1 mismatches" in report.describe()


def test_an_exact_tie_is_a_near_tie_even_under_a_zero_bound():
    report = judge_teacher_forced(torch.tensor([[2.0, 2.0, 0.0]]), [1], rule(0.0))
    assert report.passed and len(report.near_ties) == 1 and report.near_ties[0].gap == 0.0


def test_non_finite_logits_never_excuse_a_flip():
    report = judge_teacher_forced(torch.tensor([[1.0, float("nan"), 0.5]]), [1], rule(10.0))
    assert len(report.mismatches) == 1 and report.mismatches[0].gap == float("inf")


def test_bad_input_is_refused_by_name():
    with pytest.raises(ValueError, match="2 reference rows for 1 tokens"):
        judge_teacher_forced(torch.zeros(2, 3), [0], rule(0.1))
    with pytest.raises(ValueError, match="outside the reference's vocabulary of 3"):
        judge_teacher_forced(torch.zeros(1, 3), [7], rule(0.1))


def test_the_rule_is_the_measurement_times_its_margin_capped_by_the_ceiling():
    r = NearTieRule.from_measurement([1e-7, 3e-7, 2e-7], torch.float32, top_logit=10.0)
    assert r.bound == pytest.approx(MARGIN * 2 * 3e-7) and r.measured == 3e-7 and r.positions == 3
    capped = NearTieRule.from_measurement([1.0], torch.bfloat16, top_logit=20.0)
    assert capped.bound == tolerance_for(torch.bfloat16).bound(20.0)
    assert NearTieRule.from_measurement([], torch.float32, 1.0).bound == 0.0


def test_rounding_deltas_look_at_the_top_two_of_either_side():
    a = torch.tensor([[3.0, 2.0, 0.0, -1.0]])
    b = torch.tensor([[3.0, 2.5, 0.0, 5.0]])  # b's top two are tokens 3 and 0
    assert rounding_deltas(a, b) == [6.0]
    assert rounding_deltas(a, a) == [0.0]


def test_excess_near_ties_is_in_units_of_the_plain_rate_noise():
    plain = IdentityReport(positions=1000, flips=[])
    clean = IdentityReport(positions=500)
    assert excess_near_ties(clean, plain) < 0
    flips = judge_teacher_forced(torch.tensor([[1.0, 1.0]] * 6), [1] * 6, rule(0.0))
    assert excess_near_ties(flips, plain) == pytest.approx(5.0)  # 6 ties, 0 expected, one of slack


@pytest.fixture(scope="module", params=["float32", "bfloat16"])
def tiny_plain(request, workspace):
    llm = LLM(str(workspace.target_dir), dtype=request.param, kv_cache_bytes=16 << 20, max_model_len=256)
    batch = prompts(12)
    outs = [o.outputs[0].token_ids for o in llm.generate(batch, SamplingParams(temperature=0, max_tokens=24,
                                                                                  ignore_eos=True))]
    return llm, batch, outs


def test_reference_logits_are_plain_decodings_and_release_their_pages(tiny_plain):
    llm, batch, outs = tiny_plain
    pool = llm.engine.pool
    refs = reference_logits(llm.engine, batch[:3], outs[:3])
    chunked = reference_logits(llm.engine, batch[:3], outs[:3], chunk=5)
    pool.assert_all_free()
    for ref, again, out in zip(refs, chunked, outs):
        assert ref.shape == (len(out), llm.engine.config.vocab_size)
        assert ref.argmax(-1).tolist() == again.argmax(-1).tolist() or llm.engine.dtype != torch.float32
    assert judge_outputs(llm.engine, batch, outs, measure_rule(llm.engine, batch, outs, chunk=5)).passed


def test_the_measured_rule_covers_held_out_rounding(tiny_plain):
    """Measured on half the prompts, the bound covers the other half's plain-vs-plain rounding with margin:
    every held-out difference is within bound / MARGIN of a flip's worst case, and every flip between
    plain decoding at batch size 1 and the teacher-forced reference is within the bound."""
    llm, batch, outs = tiny_plain
    engine = llm.engine
    r = measure_rule(engine, batch[:6], outs[:6], chunk=5)
    held_out = [d for a, b in zip(reference_logits(engine, batch[6:], outs[6:]),
                                  reference_logits(engine, batch[6:], outs[6:], chunk=3)) for d in rounding_deltas(a, b)]
    assert 2 * max(held_out) <= r.bound, (max(held_out), r.describe())
    alone = [llm.generate([p], SamplingParams(temperature=0, max_tokens=24, ignore_eos=True))[0].outputs[0].token_ids
             for p in batch[6:]]
    report = judge_outputs(engine, batch[6:], alone, r)
    assert report.passed, report.describe()
