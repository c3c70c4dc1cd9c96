"""The start-up profile stops at its time budget: a loaded machine must not keep a server from listening."""
from __future__ import annotations

import pytest

from hyspec.errors import HyspecError
from hyspec.policy.cost_model import CostModel


def test_profile_stops_at_the_budget_cheapest_points_first():
    now = [0.0]
    timed: list[tuple[int, int]] = []

    def measure(b: int, n: int) -> float:
        now[0] += 1.0  # every call takes a second of wall time
        timed.append((b, n))
        return 0.01 + 0.001 * b * n

    model = CostModel.profile(measure, batch_sizes=(1, 2, 4), token_counts=(1, 2, 4), repeats=1,
                              budget_s=3.5, clock=lambda: now[0])
    # the warm-up call, then points until 3.5 s have gone: totals 1, 2, 2 (cheapest first), then none
    assert timed[1:] == [(1, 1), (1, 2), (2, 1)]
    assert model.num_anchor_samples == 3
    assert model.fitted  # two distinct totals: a line is fitted from what was timed
    assert model.predict(1, 1) == pytest.approx(0.011)


def test_profile_without_budget_times_the_whole_grid():
    model = CostModel.profile(lambda b, n: 0.01 * b * n, batch_sizes=(1, 2), token_counts=(1, 3), repeats=1)
    assert model.num_anchor_samples == 4


def test_profile_refuses_a_non_positive_budget():
    with pytest.raises(HyspecError, match="budget_s"):
        CostModel.profile(lambda b, n: 0.01, budget_s=0)


def test_a_budget_that_leaves_only_the_largest_points_is_an_info_line_and_fewer_than_half_a_warning(caplog):
    import logging

    from hyspec.policy.cost_model import CostModel
    from hyspec.policy.profiling import report_budget_stop
    grid = CostModel.grid_order((1, 2, 4, 8, 16, 32), (1, 2, 4, 8, 16))
    assert grid[-1] == (32, 16) and grid[0] == (1, 1)
    with caplog.at_level(logging.INFO, logger="hyspec.policy.profiling"):
        report_budget_stop(grid, 28, 20.0)
        report_budget_stop(grid, 10, 20.0)
        report_budget_stop(grid, 30, 20.0)  # all timed: nothing to say
    (idle, busy) = caplog.records
    assert idle.levelno == logging.INFO and "28 of 30" in idle.getMessage() and "(32x8, 32x16)" in idle.getMessage()
    assert busy.levelno == logging.WARNING and "slow or busy" in busy.getMessage()
