"""Sizing scored drafts after drafting (draft_sizing.py): calibration, the goodput choice, exploration, and
the trees it hands to verification."""
from __future__ import annotations

import pytest

from hyspec.errors import HyspecError
from hyspec.policy.controller import GoodputController
from hyspec.policy.cost_model import CostModel, StepSample
from hyspec.policy.draft_sizing import PRIOR_WEIGHT, DraftSizer, cell_of
from hyspec.seam.tree import DraftTree, NodeScores
from hyspec.spec.config import SpeculativeConfig


def chain(n: int, conditional: float = 1.0, source: int = 0, match: int = 8) -> DraftTree:
    return DraftTree(list(range(1, n + 2)), list(range(-1, n)), vocab_size=100,
                     scores=NodeScores((conditional,) * n, source, match))


def test_cells_bucket_source_match_length_and_the_drafters_own_estimate():
    assert cell_of(0, 1, 1.0) == (0, 0, 3)
    assert cell_of(1, 2, 0.5) == (1, 1, 2)
    assert cell_of(0, 40, 0.1) == (0, 5, 0)
    assert cell_of(0, 16, 0.99) == cell_of(0, 31, 1.0)


def test_calibration_starts_at_the_prior_and_follows_what_verification_accepted():
    sizer = DraftSizer(prior=0.9, explore_interval=0)
    tree = chain(4, source=1, match=20)
    cell = cell_of(1, 20, 1.0)
    assert sizer.acceptance(cell) == pytest.approx(0.9)
    for _ in range(50):
        sizer.observe(tree, [1, 2, 3, 4])  # all four accepted
    high = sizer.acceptance(cell)
    assert high > 0.97
    other = cell_of(0, 1, 0.3)
    low_tree = DraftTree([5, 6, 7], [-1, 0, 1], vocab_size=100, scores=NodeScores((0.3, 0.3), 0, 1))
    for _ in range(20):
        sizer.observe(low_tree, [])  # the first node rejected; the second was never reached
    assert sizer.acceptance(other) < 0.2
    # node 2 of low_tree was not reached: only node 1 counted (20 samples, plus the prior's weight)
    assert sizer._reached[other] == pytest.approx(sum(0.995 ** i for i in range(20)))
    assert sizer.acceptance(other) == pytest.approx(0.9 * PRIOR_WEIGHT / (sizer._reached[other] + PRIOR_WEIGHT))
    p = sizer.path_acceptance(tree)
    assert p == sorted(p, reverse=True) and p[0] == pytest.approx(high)


def test_cheap_rows_keep_every_node_and_dear_rows_keep_none_until_a_probe():
    sizer = DraftSizer(prior=0.9, explore_interval=3)
    trees = {"a": chain(6), "b": chain(3)}
    kept = sizer.size(trees, 2, lambda n: 0.010 + 0.0001 * n, plain_goodput=2 / 0.010)
    assert {k: t.num_nodes for k, t in kept.items()} == {"a": 7, "b": 4}
    dear = lambda n: 0.010 + 0.010 * n  # noqa: E731 (a row costs a whole step: never worth it)
    assert sizer.size(trees, 2, dear, plain_goodput=2 / 0.010) == {}
    assert sizer.size(trees, 2, dear, plain_goodput=2 / 0.010) == {}
    probe = sizer.size(trees, 2, dear, plain_goodput=2 / 0.010)  # the third empty step: verify all once
    assert set(probe) == {"a", "b"} and sizer.empty_streak == 0


def test_surer_drafts_are_kept_longer_and_every_kept_set_is_a_tree():
    sizer = DraftSizer(prior=0.9, explore_interval=0)
    sure, unsure = chain(10, 1.0, source=1, match=30), chain(10, 0.3, source=0, match=1)
    for _ in range(100):
        sizer.observe(sure, list(range(1, 11)))
        sizer.observe(unsure, [1])
    # a row costs a fifth of a plain step: worth verifying while P > ~0.2
    kept = sizer.size({"s": sure, "u": unsure}, 2, lambda n: 0.010 + 0.002 * n, plain_goodput=2 / 0.010)
    assert kept["s"].num_nodes == 11
    assert "u" not in kept or kept["u"].num_nodes < 4
    branchy = DraftTree([1, 2, 3, 4, 5], [-1, 0, 0, 1, 2], vocab_size=100,
                        scores=NodeScores((0.6, 0.4, 1.0, 1.0), 0, 8))
    for budget_rows in (1, 2, 3):
        out = DraftSizer(0.9, 0).size({"t": branchy}, 1, lambda n: 0.010 + 0.004 * max(0, n - budget_rows) ** 2,
                                       plain_goodput=1 / 0.010)
        if out:
            parents = out["t"].parents.tolist()
            assert all(p < i for i, p in enumerate(parents) if i)  # a valid tree: parents kept, before children


def test_unscored_trees_pass_through_whole():
    plain_tree = DraftTree([1, 2, 3], [-1, 0, 1], vocab_size=100)
    out = DraftSizer(0.9, 0).size({"x": plain_tree, "y": chain(2)}, 2, lambda n: 0.010, 2 / 0.010)
    assert out["x"] is plain_tree


def test_keep_renumbers_parents_and_refuses_orphans():
    tree = DraftTree([9, 1, 2, 3, 4], [-1, 0, 0, 1, 3], vocab_size=100,
                     scores=NodeScores((0.5, 0.4, 0.9, 0.8), 1, 5))
    cut = tree.keep([1, 3])
    assert cut.tokens.tolist() == [9, 1, 3] and cut.parents.tolist() == [-1, 0, 1]
    assert cut.scores.conditional == (0.5, 0.9) and cut.scores.source == 1
    with pytest.raises(HyspecError, match="parent"):
        tree.keep([2, 4])
    with pytest.raises(HyspecError, match="scores"):
        DraftTree([1, 2], [-1, 0], scores=NodeScores((0.5, 0.5)))


def test_the_controller_drafts_scored_methods_only_where_whole_acceptance_could_pay():
    cfg = SpeculativeConfig.from_dict({"method": "suffix", "num_speculative_tokens": 8})
    cheap = CostModel([StepSample(b, n, 0.010 + 0.0001 * b * n) for b in (1, 8) for n in (1, 2, 5, 9)])
    dear = CostModel([StepSample(b, n, 0.010 * b * n) for b in (1, 8) for n in (1, 2, 5, 9)])
    assert GoodputController(cfg, cheap).choose_scored_budget("suffix", 8) == cfg.tree.budget
    assert GoodputController(cfg, dear).choose_scored_budget("suffix", 8) == 0
    off = SpeculativeConfig.from_dict({"method": "suffix", "num_speculative_tokens": 8,
                                       "controller": {"enabled": False}})
    trees = {"a": chain(4)}
    assert GoodputController(off, dear).size_scored("suffix", 1, trees) is trees
