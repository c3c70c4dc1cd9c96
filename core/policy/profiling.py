"""Start-up profile of the target step cost on the live backend (for the goodput controller)."""
from __future__ import annotations

import logging
import time

import torch

from hyspec.kv.sequence_kv import SequenceKV
from hyspec.policy.cost_model import CostModel
from hyspec.seam.forward import NO_LOGITS, Feed
from hyspec.seam.target import TargetContext

log = logging.getLogger(__name__)

CONTEXT = 16  # tokens of context per profiled sequence: attention cost is small next to weights here
#: wall time after which no further grid point is timed: the full grid takes seconds on an idle machine, but
#: many minutes on a loaded one, during which a server does not listen (the cost model refines online anyway)
BUDGET_S = 20.0


def profile_cost_model(target: TargetContext, token_counts: tuple[int, ...] = (1, 2, 4, 8, 16),
                       budget_s: float = BUDGET_S) -> CostModel:
    """Time one verification step for (batch, tokens) on a grid that fits the pool and the batch limit,
    cheapest points first, until ``budget_s`` of wall time has gone."""
    runner, layout, pool = target.runner, target.layout, target.pool
    if runner is None or layout is None or pool is None:
        raise ValueError("profiling needs the target's runner, KV layout and pool (an engine's TargetContext)")
    per_seq = CONTEXT + max(token_counts)
    fits = pool.num_free * layout.block_size // max(per_seq + layout.block_size, 1)
    batch_sizes = tuple(b for b in (1, 2, 4, 8, 16, 32) if b <= max(1, min(target.max_num_seqs, fits)))
    vocab = target.vocab_size

    @torch.inference_mode()
    def measure(batch: int, tokens: int) -> float:
        kvs = [SequenceKV(pool, layout) for _ in range(batch)]
        try:
            for kv in kvs:
                kv.reserve(CONTEXT + tokens, reclaim=False)
            ids = torch.randint(0, vocab, (CONTEXT + tokens,)).tolist()
            runner.run([Feed(kv, ids[:CONTEXT], 0, logits=NO_LOGITS) for kv in kvs])  # untimed context
            feeds = [Feed(kv, ids[CONTEXT:], CONTEXT) for kv in kvs]
            target.backend.synchronize()
            t0 = time.perf_counter()
            runner.run(feeds)
            target.backend.synchronize()
            return time.perf_counter() - t0
        finally:
            for kv in kvs:
                kv.release()

    t0 = time.perf_counter()
    model = CostModel.profile(measure, batch_sizes=batch_sizes, token_counts=token_counts, budget_s=budget_s)
    report_budget_stop(CostModel.grid_order(batch_sizes, token_counts), model.num_anchor_samples, budget_s)
    log.info("profiled the target step cost in %.1fs: %s", time.perf_counter() - t0, model.coefficients())
    return model


def report_budget_stop(grid: list[tuple[int, int]], timed: int, budget_s: float) -> None:
    """Say which grid points the budget left untimed.  The largest points take most of the time, so an idle
    machine may leave one or two to online learning (an info line); a warning only when fewer than half were timed,
    which does mean a slow or busy machine."""
    if timed >= len(grid):
        return
    left = grid[timed:]
    shown = ", ".join(f"{b}x{n}" for b, n in left[:4]) + (" ..." if len(left) > 4 else "")
    level = logging.WARNING if timed < len(grid) / 2 else logging.INFO
    log.log(level, "profiling the target step cost: the %.0f s start-up budget ran out with %d of %d (batch, tokens) "
            "points timed; the cost model learns the largest ones online (%s)%s", budget_s, timed, len(grid), shown,
            " -- the machine is slow or busy" if level == logging.WARNING else "")
