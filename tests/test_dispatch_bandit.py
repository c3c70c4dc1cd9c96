"""The hybrid's learned policy: warm-up, exploitation of measured goodput, bounded exploration, classes, rules."""
from __future__ import annotations

import json

import pytest

from hyspec.policy.bandit import BanditPolicy, parent_class, step_class
from hyspec.policy.dispatcher import HybridDispatcher
from hyspec.policy.rules import BANDIT, RuleFileError, parse_rules
from hyspec.policy.signals import StepSignals
from hyspec.errors import ConfigError
from hyspec.spec.config import SpeculativeConfig

GOODPUT = {"ngram": 120.0, "suffix": 90.0, "none": 60.0}


def run(policy, klass, steps, goodput=GOODPUT):
    chosen = []
    for _ in range(steps):
        arm = policy.choose(klass)
        policy.observe(klass, arm, tokens=int(goodput[arm]), seconds=1.0)
        chosen.append(arm)
    return chosen


def test_every_arm_is_tried_warmup_times_first():
    policy = BanditPolicy(["ngram", "suffix", "none"], warmup=2)
    first = run(policy, "c", 6)
    assert sorted(first) == ["ngram", "ngram", "none", "none", "suffix", "suffix"]


def test_it_settles_on_the_best_goodput_and_explores_a_bounded_share():
    policy = BanditPolicy(["ngram", "suffix", "none"], explore_fraction=0.1, warmup=2)
    chosen = run(policy, "c", 206)
    after = chosen[6:]
    assert after.count("ngram") >= 0.9 * len(after) - 1
    snap = policy.snapshot()
    assert snap.explorations <= 0.1 * 206 + 1
    assert snap.goodput[("c", "ngram")] == pytest.approx(120.0)
    assert sum(n for (k, _), n in snap.choices.items() if k == "c") == 206


def test_classes_learn_separately():
    policy = BanditPolicy(["ngram", "none"], warmup=1)
    run(policy, "small", 30, {"ngram": 100.0, "none": 50.0})
    run(policy, "large", 30, {"ngram": 40.0, "none": 80.0})
    assert policy.choose("small") == "ngram" or policy.choose("small") == "ngram"
    picks = [policy.choose("large") for _ in range(5)]
    assert picks.count("none") >= 4


def test_a_method_that_stops_paying_is_dropped():
    policy = BanditPolicy(["ngram", "none"], explore_fraction=0.2, warmup=1, discount=0.8)
    run(policy, "c", 40, {"ngram": 100.0, "none": 50.0})
    later = run(policy, "c", 60, {"ngram": 20.0, "none": 50.0})
    assert later[-20:].count("none") >= 15


@pytest.mark.parametrize("context, batch, label", [(10, 1, "ctx<=256,bs<=1"), (600, 3, "ctx<=1024,bs<=4"),
                                                   (5000, 32, "ctx>4096,bs>16")])
def test_step_classes(context, batch, label):
    assert step_class(context, batch) == label


@pytest.mark.parametrize("match, bucket", [(0, "match<=0"), (3, "match<=3"), (4, "match<=15"), (16, "match>15")])
def test_a_measured_match_length_is_part_of_the_class(match, bucket):
    assert step_class(10, 1, match) == f"ctx<=256,bs<=1,{bucket}"


def test_match_classes_keep_a_copy_apart_from_a_fresh_question():
    """Suffix commits many tokens a step where it can copy and pays nothing where it cannot: with the match
    bucket in the class the bandit copies with suffix and decodes the rest plainly, request after request,
    instead of carrying the last request's means into the next."""
    bandit = BanditPolicy(["suffix", "none"], explore_fraction=0.1, warmup=1)
    d = HybridDispatcher(None, ["suffix"], reload_interval_s=None, bandit=bandit)
    goodput = {(True, "suffix"): 600.0, (True, "none"): 110.0, (False, "suffix"): 95.0, (False, "none"): 110.0}
    chosen = {True: [], False: []}
    for request in range(20):
        copies = request % 2 == 0  # re-runs and fresh questions alternate
        for _ in range(15):
            method = d.choose(StepSignals(context_length=100, batch_size=1, match_length=16 if copies else 0))
            d.observe_step(int(goodput[(copies, method)]), 1.0)
            chosen[copies].append(method)
    for copies, best in ((True, "suffix"), (False, "none")):
        later = chosen[copies][20:]
        assert later.count(best) >= 0.85 * len(later)
    assert set(k for k, _ in bandit.snapshot().choices) == {"ctx<=256,bs<=1,match>15", "ctx<=256,bs<=1,match<=0"}


def test_a_rare_class_borrows_from_its_parent_class():
    """ctx<=1024,bs<=1,match<=3 starts from what ctx<=256,bs<=1,match<=3 learnt (their parent: bs<=1,match<=3):
    no warm-up of arms the parent knows, and two unlucky steps of its own do not outweigh the parent."""
    assert parent_class("ctx<=1024,bs<=1,match<=3") == "bs<=1,match<=3"
    assert parent_class("ctx<=256,bs<=4") == "bs<=4" and parent_class("small") is None
    policy = BanditPolicy(["suffix", "none"], warmup=2)
    run(policy, "ctx<=256,bs<=1,match<=3", 60, {"suffix": 170.0, "none": 140.0})
    rare = "ctx<=1024,bs<=1,match<=3"
    assert policy.choose(rare) == "suffix"  # no warm-up: the parent has tried both arms
    policy.observe(rare, "suffix", tokens=80, seconds=1.0)  # an unlucky first step in the rare class
    assert policy.choose(rare) == "suffix"
    policy.observe(rare, "suffix", tokens=80, seconds=1.0)
    for _ in range(40):  # but a class that really differs goes its own way
        arm = policy.choose(rare)
        policy.observe(rare, arm, tokens=80 if arm == "suffix" else 140, seconds=1.0)
    assert [policy.choose(rare) for _ in range(5)].count("none") >= 4


def test_above_batch_1_a_lead_inside_the_plain_margin_decodes_plainly():
    """suffix measures 3 % above plain: noise at a large batch, where plain is the safe arm; a real lead (10 %)
    is still taken, and at batch 1, where verification is nearly free, no margin applies."""
    def settle(goodput, batch):
        policy = BanditPolicy(["suffix", "none"], explore_fraction=0.1, warmup=2, plain_margin=0.05)
        chosen = []
        for _ in range(100):
            arm = policy.choose("c", batch)
            policy.observe("c", arm, tokens=int(goodput[arm]), seconds=1.0)
            chosen.append(arm)
        return chosen[-50:]

    assert settle({"suffix": 103.0, "none": 100.0}, 16).count("none") >= 45
    assert settle({"suffix": 110.0, "none": 100.0}, 16).count("suffix") >= 45
    assert settle({"suffix": 103.0, "none": 100.0}, 1).count("suffix") >= 45
    without = BanditPolicy(["suffix", "none"], warmup=2)  # plain_margin 0 (the class's default): the mean rules
    assert run(without, "c", 100, {"suffix": 103.0, "none": 100.0})[-50:].count("suffix") >= 45


def test_the_engine_passes_the_configured_margin_and_batch_size_to_the_bandit():
    assert SpeculativeConfig.from_dict({"method": "hybrid", "hybrid": {"policy": "bandit"}}).hybrid \
        .bandit_plain_margin == 0.05
    with pytest.raises(ConfigError, match="bandit_plain_margin"):
        SpeculativeConfig.from_dict({"method": "hybrid", "hybrid": {"policy": "bandit", "bandit_plain_margin": 0.7}})
    bandit = BanditPolicy(["suffix", "none"], warmup=1, plain_margin=0.05)
    d = HybridDispatcher(None, ["suffix"], reload_interval_s=None, bandit=bandit)
    for batch, want in ((16, "none"), (1, "suffix")):
        for _ in range(60):
            method = d.choose(signals(batch=batch))
            d.observe_step(103 if method == "suffix" else 100, 1.0)
        assert [d.choose(signals(batch=batch)) for _ in range(3)].count(want) >= 2


@pytest.mark.parametrize("kwargs, key", [({"explore_fraction": 0.0}, "bandit_explore_fraction"),
                                         ({"explore_fraction": 0.9}, "bandit_explore_fraction"),
                                         ({"warmup": 0}, "bandit_warmup"), ({"discount": 1.5}, "bandit_discount"),
                                         ({"plain_margin": -0.1}, "bandit_plain_margin"),
                                         ({"plain_margin": 0.6}, "bandit_plain_margin"),
                                         ({"max_backoff": 0}, "bandit_max_backoff"),
                                         ({"max_backoff": 2.5}, "bandit_max_backoff")])
def test_bad_settings_name_the_key(kwargs, key):
    with pytest.raises(ConfigError, match=key):
        BanditPolicy(["ngram", "none"], **kwargs)


def test_a_bandit_over_no_methods_is_refused():
    with pytest.raises(ConfigError, match="at least one method"):
        BanditPolicy([])


# -- rules and the dispatcher --------------------------------------------------------------------------

def signals(batch=1, context=100.0):
    return StepSignals(context_length=context, batch_size=batch, mem_usage=0.1, load=batch / 64, queue_depth=0,
                       remote_health=1.0, max_context_length=context, accept_rate={})


def test_a_rule_can_hand_steps_to_the_bandit_or_pin_a_method():
    rules = parse_rules('[{"when": "batch_size > 8", "method": "none"}, {"when": "batch_size <= 8", '
                        '"policy": "bandit"}]')
    assert [r.method for r in rules] == ["none", BANDIT]
    with pytest.raises(RuleFileError, match="both"):
        parse_rules('[{"method": "ngram", "policy": "bandit"}]')
    with pytest.raises(RuleFileError, match="unknown policy 'ucb'"):
        parse_rules('[{"policy": "ucb"}]')


def test_rules_that_hand_steps_to_an_unconfigured_bandit_are_refused(tmp_path):
    path = tmp_path / "rules.json"
    path.write_text(json.dumps([{"when": "batch_size <= 8", "policy": "bandit"}]))
    with pytest.raises(RuleFileError, match='hybrid.policy is not "bandit"') as err:
        HybridDispatcher(path, ["ngram"], reload_interval_s=None)
    assert err.value.line == 1


def test_a_reload_to_such_rules_keeps_the_old_ones(tmp_path):
    path = tmp_path / "rules.json"
    path.write_text(json.dumps([{"method": "ngram"}]))
    d = HybridDispatcher(path, ["ngram"], reload_interval_s=0)
    path.write_text(json.dumps([{"policy": "bandit"}, {"method": "none"}]))
    assert not d.reload()
    assert d.choose(signals()) == "ngram" and "bandit" in str(d.last_reload_error)


def test_the_bandit_decides_unmatched_steps_pinned_rules_win_and_it_learns(tmp_path):
    path = tmp_path / "rules.json"
    path.write_text(json.dumps([{"when": "batch_size > 16", "method": "none"}]))
    bandit = BanditPolicy(["ngram", "suffix", "none"], warmup=1)
    d = HybridDispatcher(path, ["ngram", "suffix"], reload_interval_s=None, bandit=bandit)
    assert d.choose(signals(batch=32)) == "none"  # pinned by the rule
    d.observe_step(32, 1.0)  # a pinned step teaches the bandit nothing
    assert bandit.snapshot().choices == {}
    for _ in range(30):
        method = d.choose(signals(batch=1))
        d.observe_step(int(GOODPUT[method]), 1.0)
    snap = d.snapshot().bandit
    assert snap.choices[("ctx<=256,bs<=1", "ngram")] >= 24
    assert set(snap.goodput) == {("ctx<=256,bs<=1", m) for m in ("ngram", "suffix", "none")}


def test_match_length_is_measured_only_for_a_bandit_or_a_rule_that_reads_it(tmp_path):
    path = tmp_path / "rules.json"
    path.write_text(json.dumps([{"when": "batch_size > 8", "method": "none"}, {"method": "ngram"}]))
    d = HybridDispatcher(path, ["ngram"], reload_interval_s=None)
    assert not d.needs_match_length
    path.write_text(json.dumps([{"when": "match_length >= 8", "method": "ngram"}]))
    assert d.reload() and d.needs_match_length
    assert HybridDispatcher(None, ["ngram"], reload_interval_s=None, bandit=BanditPolicy(["ngram"])).needs_match_length


def test_acceptance_and_remote_health_are_gathered_only_for_a_rule_that_reads_them(tmp_path):
    path = tmp_path / "rules.json"
    path.write_text(json.dumps([{"when": "batch_size > 8", "method": "none"}, {"method": "ngram"}]))
    d = HybridDispatcher(path, ["ngram"], reload_interval_s=None)
    assert not d.needs_accept_rate and not d.needs_remote_health
    path.write_text(json.dumps([{"when": "accept_rate.ngram > 0.5 and remote_health > 0.5", "method": "ngram"}]))
    assert d.reload() and d.needs_accept_rate and d.needs_remote_health
    bandit_only = HybridDispatcher(None, ["ngram"], reload_interval_s=None, bandit=BanditPolicy(["ngram", "none"]))
    assert not bandit_only.needs_accept_rate and not bandit_only.needs_remote_health


def test_the_dispatcher_gate_hands_rules_the_acceptance_they_read(tmp_path):
    from types import SimpleNamespace

    from hyspec.policy.chain import DispatcherGate

    seq = SimpleNamespace(token_ids=[1, 2, 3])
    step = SimpleNamespace(scheduler=SimpleNamespace(running=[seq], waiting=[], config=SimpleNamespace(max_num_seqs=4)),
                           proposers={"ngram": object()}, decoding=[seq])
    controller = SimpleNamespace(first_acceptance=lambda method: 0.75)
    pool = SimpleNamespace(usage=lambda: 0.0)
    path = tmp_path / "rules.json"
    path.write_text(json.dumps([{"when": "accept_rate.ngram > 0.5", "method": "ngram"}, {"method": "none"}]))
    gate = DispatcherGate(HybridDispatcher(path, ["ngram"], reload_interval_s=None), controller, pool)
    assert gate.signals(step).accept_rate == {"ngram": 0.75} and gate(step).method == "ngram"
    path.write_text(json.dumps([{"when": "batch_size > 8", "method": "none"}, {"method": "ngram"}]))
    assert gate.dispatcher.reload() and gate.signals(step).accept_rate == {}


def test_without_a_rule_file_a_bandit_decides_every_step():
    d = HybridDispatcher(None, ["eagle"], reload_interval_s=None, bandit=BanditPolicy(["eagle", "none"]))
    assert d.rules == ()  # the built-in rules would pin eagle
    assert {d.choose(signals()) for _ in range(4)} == {"eagle", "none"}


def test_config_keys_are_checked_and_named():
    cfg = SpeculativeConfig.from_dict({"method": "hybrid", "hybrid": {"policy": "bandit"}})
    assert cfg.hybrid.policy == "bandit" and cfg.hybrid.bandit_explore_fraction == 0.1
    for section, message in (({"policy": "ucb"}, "hybrid.policy"),
                             ({"bandit_explore_fraction": 0.7}, "hybrid.bandit_explore_fraction"),
                             ({"bandit_warmup": 0}, "hybrid.bandit_warmup")):
        with pytest.raises(ConfigError, match=message):
            SpeculativeConfig.from_dict({"method": "hybrid", "hybrid": section})


def test_the_bandits_state_is_exported():
    from hyspec.server.metrics import _dispatch_families

    bandit = BanditPolicy(["ngram", "none"], warmup=1)
    d = HybridDispatcher(None, ["ngram"], reload_interval_s=None, bandit=bandit)
    for _ in range(3):
        d.choose(signals())
        d.observe_step(10, 0.1)
    families = {f.name: f for f in _dispatch_families(d.snapshot())}
    choices = families["hyspec_dispatch_bandit_choices"].samples
    assert {s.labels["method"] for s in choices} == {"ngram", "none"}
    assert all(s.labels["step_class"] == "ctx<=256,bs<=1" for s in choices)
    assert families["hyspec_dispatch_bandit_goodput_tokens_per_second"].samples[0].value == pytest.approx(100.0)


def test_exploration_is_bounded_by_time_as_well_as_steps():
    """At batch 32 a speculative step can cost several plain steps: a tenth of the steps must not be a third
    of the time.  Here the explored arm's steps take 5 s against the best arm's 1 s."""
    seconds = {"none": 1.0, "suffix": 5.0}
    tokens = {"none": 32, "suffix": 60}  # suffix: 12 tok/s, plain 32 tok/s
    policy = BanditPolicy(["none", "suffix"], explore_fraction=0.1, warmup=1)
    spent = {"none": 0.0, "suffix": 0.0}
    for _ in range(400):
        arm = policy.choose("c")
        policy.observe("c", arm, tokens=tokens[arm], seconds=seconds[arm])
        spent[arm] += seconds[arm]
    share = spent["suffix"] / sum(spent.values())
    # explored still, within the time bound: over it by at most its warm-up step and one exploring step
    assert 0.03 < share <= 0.1 + 2 * 5.0 / sum(spent.values())
    # bounded by steps alone (the old rule) it would have been about 40 of 400 steps: 200 s of 560, 36 %
    assert policy.snapshot().explorations < 40 / 2


def test_arms_that_keep_losing_are_explored_ever_less_often():
    """Nine arms, one of which pays (the default model's drafters on a 2-core CPU): exploring each loser in
    turn every tenth step gave away most of the best arm's lead; with back-off they are tried rarely."""
    goodput = {"suffix": 350.0, "none": 140.0, **{f"drafter{i}": 120.0 + i for i in range(7)}}
    policy = BanditPolicy(list(goodput), explore_fraction=0.1, warmup=2)
    chosen = run(policy, "c", 3000, goodput)
    later = chosen[1000:]
    assert later.count("suffix") >= 0.97 * len(later)  # 0.988 here; without back-off (max_backoff=1) 0.900
    for arm in goodput:
        if arm != "suffix":
            assert 1 <= later.count(arm) <= 10, (arm, later.count(arm))  # still tried, rarely


def test_a_backed_off_arm_that_starts_to_pay_is_found_again():
    policy = BanditPolicy(["suffix", "eagle3", "none"], explore_fraction=0.1, warmup=2, discount=0.9)
    run(policy, "c", 600, {"suffix": 300.0, "eagle3": 100.0, "none": 140.0})
    assert policy._classes["c"].arms["eagle3"].backoff > 1  # it lost its tries and waits longer
    later = run(policy, "c", 1500, {"suffix": 300.0, "eagle3": 500.0, "none": 140.0})
    # its next exploring step (within MAX_BACKOFF base intervals) resets its interval, and it takes over
    assert later[-300:].count("eagle3") >= 0.85 * 300
    assert policy._classes["c"].arms["eagle3"].backoff == 1


def test_max_backoff_1_explores_every_other_arm_in_turn_and_the_key_reaches_the_bandit():
    goodput = {"suffix": 350.0, "none": 140.0, "eagle3": 120.0}
    policy = BanditPolicy(list(goodput), explore_fraction=0.1, warmup=2, max_backoff=1)
    later = run(policy, "c", 1000, goodput)[200:]
    assert later.count("none") >= 35 and later.count("eagle3") >= 35  # one step in twenty each, as before
    cfg = SpeculativeConfig.from_dict({"method": "hybrid", "hybrid": {"policy": "bandit", "bandit_max_backoff": 8}})
    assert cfg.hybrid.bandit_max_backoff == 8
    with pytest.raises(ConfigError, match="bandit_max_backoff"):
        SpeculativeConfig.from_dict({"method": "hybrid", "hybrid": {"policy": "bandit", "bandit_max_backoff": 0}})


def test_an_arm_whose_steps_commit_one_token_or_eight_is_not_written_off_on_unlucky_steps():
    """Suffix decoding on fresh code: most steps commit one token, one in seven commits eight, and its mean
    (228 tok/s) beats plain decoding's (143).  Judged on single steps, each unlucky exploring step doubled its
    wait and it got 46 % of the steps (182 tok/s over six seeds); now it backs off only while its estimate
    plus two standard errors is behind too."""
    import random

    def simulate(seed):
        rng = random.Random(seed)
        arms = ["suffix", "none", *(f"drafter{i}" for i in range(6))]
        policy = BanditPolicy(arms, explore_fraction=0.1, warmup=2)
        tokens = seconds = 0.0
        for _ in range(3000):
            arm = policy.choose("c", 1)
            if arm == "suffix":
                t, s = (8 if rng.random() < 0.15 else 1), 0.009
            else:
                t, s = 1, (0.007 if arm == "none" else 0.0075) * rng.uniform(0.95, 1.05)
            policy.observe("c", arm, t, s)
            tokens, seconds = tokens + t, seconds + s
        return tokens / seconds

    goodput = [simulate(seed) for seed in range(6)]
    assert sum(goodput) / len(goodput) > 200.0, goodput  # 215 here; a steady 143 tok/s plain is the floor


def run_with_vetoes(policy, klass, steps, goodput, vetoed, rng):
    """Steps through a bandit whose choices of ``vetoed`` arms the goodput controller turns into plain steps:
    those are observed as "none"'s (what ran), with plain's noisy goodput."""
    chosen = []
    for _ in range(steps):
        arm = policy.choose(klass, 1)
        ran = arm
        if arm in vetoed:
            policy.vetoed(klass, arm)
            ran = "none"
        policy.observe(klass, ran, tokens=1, seconds=1.0 / (goodput[ran] * rng.uniform(0.9, 1.1)))
        chosen.append(arm)
    return chosen


def test_arms_the_controller_vetoes_are_neither_exploited_nor_often_explored():
    """Six drafters the goodput controller gives no budget (the default model's on chat): credited with the plain
    steps they became, they were copies of plain decoding, and among six copies the luckiest estimate beat plain's
    and took most steps, each paying for a plan that drafted nothing."""
    import random

    goodput = {"suffix": 138.0, "none": 140.0, **{f"drafter{i}": 140.0 for i in range(6)}}
    vetoed = {f"drafter{i}" for i in range(6)}
    policy = BanditPolicy(list(goodput), explore_fraction=0.1, warmup=2)
    later = run_with_vetoes(policy, "c", 3000, goodput, vetoed, random.Random(0))[1000:]
    # credited with their plain steps, the vetoed arms took 1,353 of these 2,000 steps (one of them 1,068)
    assert later.count("none") >= 0.85 * len(later), {a: later.count(a) for a in goodput}
    for arm in vetoed:
        assert 1 <= later.count(arm) <= 10, (arm, later.count(arm))  # still tried, rarely
        assert policy._classes["c"].arms[arm].backoff > 1 and policy._classes["c"].arms[arm].pulls == 0


def test_a_vetoed_arm_that_later_drafts_and_pays_takes_over():
    import random

    goodput = {"suffix": 150.0, "none": 140.0, "eagle3": 140.0}
    policy = BanditPolicy(list(goodput), explore_fraction=0.1, warmup=2)
    run_with_vetoes(policy, "c", 500, goodput, {"eagle3"}, random.Random(1))
    assert policy._classes["c"].arms["eagle3"].vetoed
    later = run_with_vetoes(policy, "c", 1500, {**goodput, "eagle3": 400.0}, set(), random.Random(2))
    assert later[-300:].count("eagle3") >= 0.85 * 300  # its next exploring step drafted: judged on that
    assert not policy._classes["c"].arms["eagle3"].vetoed


def test_the_dispatcher_credits_a_vetoed_step_to_plain_decoding():
    policy = BanditPolicy(["eagle3", "none"], warmup=1)
    dispatcher = HybridDispatcher(None, ["eagle3"], reload_interval_s=None, bandit=policy)
    assert dispatcher.choose(signals()) == "eagle3"  # warm-up: least chosen first, in order
    dispatcher.vetoed()
    dispatcher.observe_step(1, 0.01)
    klass = next(iter(policy._classes))
    arms = policy._classes[klass].arms
    assert arms["eagle3"].pulls == 0 and arms["eagle3"].vetoed and arms["none"].pulls == 1
