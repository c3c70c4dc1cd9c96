"""Goodput controller and cost model: speculation only where the measured costs say it pays."""
from __future__ import annotations

import dataclasses
import math

import pytest

from hyspec.errors import HyspecError
from hyspec.policy.controller import CostModel, DraftCost, GoodputController, StepSample
from hyspec.spec.config import SpeculativeConfig

BATCHES = (1, 2, 4, 8, 16, 32, 64, 128)


def hinge_step(b: int, n: int) -> float:
    """Memory-bound (flat) up to 64 verified tokens per step, compute-bound after: a typical accelerator."""
    m = b * n
    return 0.010 + 0.00002 * b + 0.0002 * max(0, m - 64)


def linear_step(b: int, n: int) -> float:
    """Every verified token costs the same and nothing is fixed: verification never comes for free."""
    return 0.001 * b * n


def make(cost, **controller) -> GoodputController:
    k = controller.pop("num_speculative_tokens", 8)
    cfg = SpeculativeConfig.from_dict({"method": "ngram", "num_speculative_tokens": k, "controller": controller})
    model = CostModel.profile(cost, repeats=1) if callable(cost) else cost
    return GoodputController(cfg, model)


def feed_acceptance(c: GoodputController, method: str, rate: float, k: int, steps: int = 200, drafts: int = 100):
    """Drafts whose every position is accepted with conditional probability `rate` (expected counts)."""
    for _ in range(steps):
        per_pos, reached = [], drafts
        for _ in range(k):
            reached = round(reached * rate)
            per_pos.append(reached)
        c.observe_acceptance(method, per_pos, drafts)


# ---------------------------------------------------------------- cost model

def test_cost_model_recovers_a_hinge_and_predicts_off_grid():
    model = CostModel.profile(hinge_step, repeats=1)
    coef = model.coefficients()
    assert coef["knee"] == 64
    assert coef["c_knee"] == pytest.approx(0.0002, rel=1e-6)
    for b, n in [(3, 7), (48, 2), (100, 9)]:
        assert model.predict(b, n) == pytest.approx(hinge_step(b, n), rel=1e-6)


def test_cost_model_keeps_a_straight_line_when_there_is_no_knee():
    model = CostModel([StepSample(b, n, 0.002 + 0.0005 * b * n) for b in (1, 2, 4, 8) for n in (1, 3, 5)])
    assert math.isinf(model.coefficients()["knee"])
    assert model.predict(16, 9) == pytest.approx(0.002 + 0.0005 * 144, rel=1e-6)


def test_cost_model_coefficients_are_never_negative():
    # noisy, slightly decreasing data must not produce "more tokens are cheaper"
    model = CostModel([StepSample(1, n, 0.01 - 0.0001 * n) for n in (1, 2, 3, 5, 9)])
    assert all(v >= 0 for k, v in model.coefficients().items() if k != "knee")
    assert model.predict(1, 17) >= model.predict(1, 1) * 0.999


def test_profile_measures_the_grid_with_warmup_and_keeps_the_fastest_repeat():
    calls = []

    def measure(b, n):
        calls.append((b, n))
        return 0.01 * (1 + b * n) * (2 if len(calls) % 2 else 1)  # every other call is slow (noise)

    model = CostModel.profile(measure, batch_sizes=(1, 4), token_counts=(1, 5), repeats=2)
    assert len(calls) == 1 + 4 * 2
    assert set(calls) == {(1, 1), (1, 5), (4, 1), (4, 5)}
    assert model.predict(2, 3) == pytest.approx(0.07, rel=1e-6)


def test_cost_model_learns_online_from_nothing_and_tracks_drift():
    model = CostModel(refit_every=16)
    assert not model.fitted and model.predict(8, 5) == model.predict(8, 1)  # flat: optimistic
    model.observe(1, 1, 0.01)
    model.observe(4, 5, 0.05)
    assert model.fitted
    # the hardware is now 50 % slower everywhere: the residual EWMA follows at once, a refit later
    fitted = CostModel.profile(hinge_step, repeats=1, refit_every=64)
    for _ in range(200):
        for b, n in ((8, 3), (16, 5), (1, 1)):
            fitted.observe(b, n, 1.5 * hinge_step(b, n))
    assert fitted.predict(16, 5) == pytest.approx(1.5 * hinge_step(16, 5), rel=0.05)


def test_step_samples_reject_nonsense():
    with pytest.raises(HyspecError):
        StepSample(0, 1, 0.1)
    with pytest.raises(HyspecError):
        StepSample(1, 1, float("nan"))
    with pytest.raises(HyspecError):
        CostModel().observe(1, 1, -1.0)


def test_draft_cost_separates_overhead_from_per_token_cost():
    d = DraftCost(alpha=0.05)
    assert d.predict(100) == 0.0  # unmeasured: optimistic
    for i in range(400):
        n = (4, 8, 16, 32)[i % 4]
        d.observe(n, 0.002 + 0.0001 * n)
    overhead, per_token = d.coefficients()
    assert overhead == pytest.approx(0.002, rel=1e-3) and per_token == pytest.approx(0.0001, rel=1e-3)
    single = DraftCost(alpha=0.05)
    for _ in range(10):
        single.observe(8, 0.004)
    assert single.coefficients() == (0.0, pytest.approx(0.0005))


# ---------------------------------------------------------------- decisions

def test_k_is_zero_when_the_cost_model_says_verification_is_too_expensive():
    c = make(linear_step)
    feed_acceptance(c, "ngram", 0.95, 8)  # excellent drafts: acceptance alone would say "speculate"
    assert min(c.acceptance("ngram")) > 0.9
    for b in BATCHES:
        assert c.choose("ngram", b) == 0
    # and it never spends a step probing: perfect acceptance could not pay either
    assert all(c.choose("ngram", 8) == 0 for _ in range(1000))


def test_more_draft_tokens_when_acceptance_rises():
    chosen = []
    for rate in (0.2, 0.5, 0.7, 0.85, 0.95):
        c = make(lambda b, n: 0.010 + 0.003 * b * n)
        feed_acceptance(c, "ngram", rate, 8)
        chosen.append(c.choose("ngram", 1))
    assert chosen == sorted(chosen), chosen
    assert chosen[0] == 0 and chosen[-1] >= 6, chosen


def test_k_shrinks_as_batch_grows_when_large_batches_make_verification_expensive():
    c = make(hinge_step)
    feed_acceptance(c, "ngram", 0.8, 8)
    ks = [c.choose("ngram", b) for b in BATCHES]
    assert ks == sorted(ks, reverse=True), ks
    assert ks[0] == 8 and ks[-1] == 0, ks


def test_slow_drafter_turns_speculation_off():
    c = make(hinge_step)
    feed_acceptance(c, "ngram", 0.8, 8)
    assert c.choose("ngram", 1) > 0
    for _ in range(100):
        c.observe_draft_time("ngram", 8, 0.2)  # 25 ms per drafted token: slower than a target step
    assert c.choose("ngram", 1) == 0


def test_a_speculative_steps_host_time_counts_against_drafting():
    # a CPU-like target: 7 ms a decode step, each verified row 1.5 ms more; 30 % first-position acceptance
    model = CostModel([StepSample(b, n, 0.0055 + 0.0015 * b * n) for b in (1, 2) for n in (1, 2, 3)])
    c = make(model, num_speculative_tokens=1, ewma_alpha=1.0, explore_interval=0)
    c.observe_acceptance("ngram", [30], 100)
    assert c.choose("ngram", 1) == 1  # the forward alone: 1.3 tokens for 8.5 ms beats 1 for 7 ms
    c.observe_host_time(1, False, 0.0014)  # a plain step's planning, sampling, commit
    assert c.host_seconds(1, True) == pytest.approx(0.0014)  # a speculative one not yet seen: the same
    c.observe_host_time(1, True, 0.0030)  # tree building, verification and KV commit cost 1.6 ms more
    assert c.choose("ngram", 1) == 0  # 1.3 tokens for 11.5 ms no longer beats 1 for 8.4 ms
    assert c.goodput("ngram", 1, 0) == pytest.approx(1 / 0.0084)
    c.observe_host_time(2, True, -1e-6)  # clock noise: ignored
    assert c.host_seconds(2, True) == 0.0


def _floor_controller(slope: float, floor: int) -> GoodputController:
    # a1 = 0.5, a2 = 0 exactly (alpha 1: the last observation is the estimate)
    c = make(lambda b, n: 0.010 + slope * b * n, num_speculative_tokens=2, ewma_alpha=1.0,
             min_draft_tokens=floor, explore_interval=0)
    c.observe_acceptance("ngram", [50, 0], 100)
    assert c.acceptance("ngram") == (0.5, 0.0)
    return c


def test_floor_raises_the_draft_length_when_speculating_pays():
    # slope 0.002: goodput plain 83, k=1 107, k=2 95 tokens/s
    assert _floor_controller(0.002, floor=0).choose("ngram", 1) == 1
    assert _floor_controller(0.002, floor=2).choose("ngram", 1) == 2


def test_floor_never_forces_speculation_the_cost_model_rejects():
    # slope 0.004: plain 71, k=1 83 (pays), k=2 68 (does not): with floor 2 -> plain decoding
    assert _floor_controller(0.004, floor=0).choose("ngram", 1) == 1
    assert _floor_controller(0.004, floor=2).choose("ngram", 1) == 0


def test_new_methods_start_optimistic_and_poor_ones_are_probed_now_and_then():
    c = make(lambda b, n: 0.010 + 0.003 * b * n, explore_interval=50)
    assert c.choose("eagle", 1) > 0  # never seen: the optimistic prior says it is worth a try
    feed_acceptance(c, "eagle", 0.05, 8)
    picks = [c.choose("eagle", 1) for _ in range(200)]
    probes = [i for i, k in enumerate(picks) if k]
    assert probes == [49, 99, 149, 199], probes  # one probe after every 50 plain steps
    assert all(picks[i] == 8 for i in probes)  # at the length perfect acceptance would use
    # the drafts recover: after a probe's observations the controller speculates again
    feed_acceptance(c, "eagle", 0.9, 8, steps=100)
    assert c.choose("eagle", 1) > 0


def test_choices_are_deterministic():
    def run():
        c = make(hinge_step, explore_interval=7)
        out = []
        for step in range(300):
            b = BATCHES[step % len(BATCHES)]
            k = c.choose("ngram", b)
            out.append(k)
            if k:
                c.observe_acceptance("ngram", [b * (step % 3 == 0)] * k, b)
                c.observe_draft_time("ngram", b * k, 0.0001 * b * k)
            c.observe_step_time(b, k + 1, hinge_step(b, k + 1) * (1 + 0.01 * (step % 5)))
        return out

    first = run()
    assert first == run()
    assert len(set(first)) > 2  # the sequence actually varies


def test_disabled_controller_always_drafts_the_maximum():
    c = make(linear_step, enabled=False, max_draft_tokens=5)
    assert [c.choose("ngram", b) for b in BATCHES] == [5] * len(BATCHES)


def test_hybrid_methods_are_capped_at_their_own_draft_length():
    cfg = SpeculativeConfig.from_dict({"method": "hybrid", "num_speculative_tokens": 8, "hybrid": {
        "methods": ["ngram", {"method": "mtp", "num_speculative_tokens": 3}]}})
    c = GoodputController(cfg, CostModel.profile(hinge_step, repeats=1))
    assert (c.choose("ngram", 1), c.choose("mtp", 1)) == (8, 3)  # flat verification at batch 1: draft all
    off = dataclasses.replace(cfg, controller=dataclasses.replace(cfg.controller, enabled=False))
    assert GoodputController(off).choose("mtp", 64) == 3


def test_tree_budget_follows_the_same_rule():
    cfg = SpeculativeConfig.from_dict({"method": "eagle", "num_speculative_tokens": 6, "tree": {"budget": 64},
                                       "controller": {"explore_interval": 0}})
    c = GoodputController(cfg, CostModel.profile(hinge_step, token_counts=(1, 2, 5, 9, 17, 33, 65), repeats=1))
    assert c.budget_buckets == (2, 4, 8, 16, 32, 64)
    budgets = [c.choose_tree_budget("eagle", b) for b in BATCHES]
    assert budgets == sorted(budgets, reverse=True) and budgets[0] >= 32 and budgets[-1] == 0, budgets
    for _ in range(200):  # measured: big trees accept no more than small ones
        for bucket in c.budget_buckets:
            c.observe_tree_acceptance("eagle", bucket, [1, 1, 2, 1])
    # verification is flat up to 64 tokens at batch 4, so any of the small budgets is best
    assert c.choose_tree_budget("eagle", 4) in (2, 4, 8)
    linear = GoodputController(cfg, CostModel.profile(linear_step, repeats=1))
    assert all(linear.choose_tree_budget("eagle", b) == 0 for b in BATCHES)


def test_a_tree_buckets_first_step_replaces_its_optimistic_prior():
    cfg = SpeculativeConfig.from_dict({"method": "suffix", "num_speculative_tokens": 6, "tree": {"budget": 8},
                                       "controller": {"explore_interval": 0}})
    c = GoodputController(cfg, CostModel([StepSample(1, n, 0.0055 + 0.0015 * n) for n in range(1, 10)]))
    assert c.choose_tree_budget("suffix", 1) > 0  # unobserved: the prior says trees pay
    for bucket in c.budget_buckets:  # one step each, 0.3 tokens accepted: far below the prior
        c.observe_tree_acceptance("suffix", bucket, [0, 0, 1, 0, 0, 0, 1, 0, 1, 0])
    assert c.choose_tree_budget("suffix", 1) == 0  # at once, not after ~50 steps of decay from the prior
    for _ in range(100):  # then an EWMA as before: acceptance rises and trees come back
        c.observe_tree_acceptance("suffix", 8, [4])
    assert c.choose_tree_budget("suffix", 1) == 8


def test_from_profile_profiles_only_when_configured():
    calls = []

    def measure(b, n):
        calls.append((b, n))
        return hinge_step(b, n)

    cfg = SpeculativeConfig.from_dict({"method": "ngram", "num_speculative_tokens": 4, "tree": {"budget": 8}})
    c = GoodputController.from_profile(cfg, measure, max_batch_size=16)
    assert c.cost_model.fitted
    assert {b for b, _ in calls} == {1, 2, 4, 8, 16} and {n for _, n in calls} == {1, 2, 3, 5, 9}
    off = SpeculativeConfig.from_dict({"method": "ngram", "controller": {"profile_at_startup": False}})
    calls.clear()
    assert not GoodputController.from_profile(off, measure, 16).cost_model.fitted and not calls


def test_bad_observations_are_rejected():
    c = make(hinge_step)
    with pytest.raises(HyspecError):
        c.observe_acceptance("ngram", [5, 6], 10)  # more accepted at position 1 than reached it
    with pytest.raises(HyspecError):
        c.choose("ngram", 0)
    with pytest.raises(HyspecError):
        GoodputController({"method": "ngram"})
    # ragged drafts: 4 of 10 drafts had a position 1; 4 accepted there is a rate of 1, not 0.4
    c2 = make(hinge_step, ewma_alpha=1.0, num_speculative_tokens=2)
    c2.observe_acceptance("ngram", [8, 4], 10, drafted_per_position=[10, 4])
    assert c2.acceptance("ngram") == (0.8, 1.0)


def test_a_ragged_verification_step_teaches_the_cost_of_its_total_rows():
    """Drafts cut to the sequences they pay for make ragged steps (one sequence 31 rows, seven 1); the
    packed forward costs their total (38 rows), and the cost model must learn that, not 8 x 31."""
    from hyspec.seam.forward import Feed
    from hyspec.spec.decoder import mean_tokens_per_seq

    def step(lengths: list[int]) -> list[Feed]:
        return [Feed(None, [1] * n, 0) for n in lengths]  # the kv is not read

    def hardware(rows: int) -> float:  # what the forward costs: fixed part + per row, whatever the shape
        return 0.004 + 0.0008 * rows

    assert mean_tokens_per_seq(step([31] + [1] * 7)) == pytest.approx(38 / 8)
    assert mean_tokens_per_seq(step([3, 3])) == 3
    model = CostModel([StepSample(8, 1, hardware(8)), StepSample(8, 2, hardware(16))])
    for _ in range(300):  # an engine at batch 8: mostly plain steps, some ragged verification steps
        for lengths in ([1] * 8, [31] + [1] * 7, [9, 9] + [1] * 6):
            feeds = step(lengths)
            model.observe(len(feeds), mean_tokens_per_seq(feeds), hardware(sum(lengths)))
    # every row the sizer might add is priced at what it costs (recorded by the longest feed, as before, a
    # uniform 8 x 31 step was predicted at 39 ms here against its 202 ms, and 38 rows at 15 ms against 34)
    assert model.predict(8, 31) == pytest.approx(hardware(248), rel=0.05)
    assert model.predict(8, 38 / 8) == pytest.approx(hardware(38), rel=0.05)


def test_the_acceptance_prior_counts_for_a_few_steps_not_fifty():
    """A chain drafter accepted 20 % of the time at its first position (chat): the optimistic prior (0.9) must
    not keep it drafting for tens of steps.  With the prior worth PRIOR_STEPS steps, fifteen verified steps
    bring the estimate near the measured rate, and positions never reached borrow the measured one's."""
    model = CostModel([StepSample(b, n, 0.008 + 0.004 * b * n) for b in (1, 2) for n in (1, 2, 3, 5, 9)])
    c = make(model, num_speculative_tokens=4, explore_interval=0)
    assert c.choose("mtp", 1) > 0  # never verified: the prior says it pays
    c.observe_acceptance("mtp", [20, 0, 0, 0], 100)
    assert 0.7 < c.acceptance("mtp")[0] < 0.8  # the prior (0.9, four steps) and one step (0.2)
    for _ in range(14):
        c.observe_acceptance("mtp", [20, 0, 0, 0], 100)
    estimates = c.acceptance("mtp")
    assert estimates[0] < 0.32 and max(estimates[1:]) < 0.1  # positions 1.. reached, never accepted
    # 1.3 tokens in 16 ms lose to 1 in 12 ms (the old EWMA from the prior still read 0.52 here, and drafted)
    assert c.choose("mtp", 1) == 0
    # a method verified only at position 0 (drafts of one token) leaves deeper positions at that estimate
    c.observe_acceptance("ngram", [30], 100)
    c.observe_acceptance("ngram", [30], 100)
    a = c.acceptance("ngram")
    assert a[1] == a[2] == a[3] == pytest.approx(a[0]) and a[0] < 0.9


def test_steady_acceptance_estimates_carry_no_prior_bias():
    c = make(hinge_step, num_speculative_tokens=2)
    feed_acceptance(c, "ngram", 0.4, 2, steps=300)
    assert c.acceptance("ngram") == pytest.approx((0.4, 0.4), abs=0.01)
    assert c.first_acceptance("ngram") == pytest.approx(0.4, abs=0.01)
    assert c.first_acceptance("eagle") == pytest.approx(0.9)  # never verified: the prior


def test_measured_tree_buckets_temper_the_prior_of_the_others():
    """EAGLE trees on chat: the buckets tried accept far below their prior; the rest must not each be drafted
    once more on the prior alone.  One unlucky tree does not write them off (the prior is one tree's worth)."""
    cfg = SpeculativeConfig.from_dict({"method": "eagle", "num_speculative_tokens": 6, "tree": {"budget": 32},
                                       "controller": {"explore_interval": 0}})
    c = GoodputController(cfg, CostModel([StepSample(1, n, 0.0055 + 0.0015 * n) for n in range(1, 34)]))
    first = c.choose_tree_budget("eagle", 1)
    assert first > 0  # unobserved: the prior says trees pay
    c.observe_tree_acceptance("eagle", first, [0])  # one tree, nothing accepted
    unmeasured = [b for b in c.budget_buckets if b != first]
    assert all(c._tree_estimate(c._state("eagle"), b) == pytest.approx(c._tree_prior(b) / 2) for b in unmeasured)
    c.observe_tree_acceptance("eagle", first, [0] * 7)  # a batch of 7 more: eight trees against the prior's one
    assert c.choose_tree_budget("eagle", 1) == 0  # the other buckets are not tried on their prior
    # a method accepted as well as its prior keeps the others' priors
    c.observe_tree_acceptance("mtp", 4, [c._tree_prior(4)])
    assert c._tree_estimate(c._state("mtp"), 16) == pytest.approx(c._tree_prior(16))
