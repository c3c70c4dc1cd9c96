"""Adaptive resource partitioning: how many threads each draft worker may use.

Field experience behind the defaults: a scheduler that cut CPU drafters to
2 cores whenever the accelerator was over 80 % busy left their CPUs 25-35 %
used; a 0.95 threshold plus a floor of cores gave +22 % throughput.  The
cut exists for workers that share a host with the target (the target's host
threads launch kernels and sample): only a target that is really saturated
takes cores back, and never below the floor.

Per worker, before each draft call (:meth:`ThreadScheduler.choose`):

* no sequences queued for the worker -> the floor (an idle worker holds little);
* target busy above ``busy_threshold`` -> the floor;
* otherwise the thread count with the lowest measured compute time per
  drafted token.  More threads are not always faster: small drafts stop
  scaling after a few threads, and on a host shared with the target or
  other jobs extra OpenMP threads wait on each other at every barrier (on
  a loaded 2-core box, 2 threads drafted 3-40x slower than 1).  So the
  scheduler measures instead of assuming: every ``EXPLORE_EVERY`` calls it
  tries a neighbouring count for ``TRIAL_CALLS`` calls and keeps it if it is
  cheaper -- fewer threads win ties (they free cores), more threads must
  be clearly cheaper; each losing trial doubles the wait before the next.
  The first trial comes after only ``TRIAL_CALLS`` calls; a call given up
  on as hopelessly late triggers one at once, and a trial that is clearly
  worse (``CLEAR_LOSS``) ends after one call.  It starts at all the node's cores (a dedicated CPU
  node) and explores downwards first.

The thread count travels in the draft call; the worker applies it with
``torch.set_num_threads`` on its compute thread.  ``busy`` is the fraction
of wall time the target spends in its own work (:class:`BusyMeter`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

EXPLORE_EVERY = 16  # calls at the current count before trying a neighbour ...
MAX_EXPLORE_BACKOFF = 16  # ... doubled after each trial that lost, up to 16x (settled workers rarely explore)
TRIAL_CALLS = 6  # calls measured at the neighbour
COST_ALPHA = 0.3  # EWMA weight of the newest per-token cost
FEWER_THREADS_TOLERANCE = 0.05  # fewer threads are kept unless >5 % costlier; more must be >5 % cheaper
CLEAR_LOSS = 3.0  # a trial this many times costlier than home ends after its first call
IDLE_GAP_S = 1.0  # a longer pause between steps is the engine idling, not the target working


@dataclass(frozen=True)
class ThreadPolicy:
    busy_threshold: float = 0.95
    min_cores: int = 4
    fixed: int | None = None  # a fixed cap instead of adapting (the baseline the field report replaced)

    def __post_init__(self) -> None:
        if not 0.0 < self.busy_threshold <= 1.0:
            raise ValueError(f"busy_threshold must be in (0, 1], got {self.busy_threshold}")
        if self.min_cores < 1:
            raise ValueError(f"min_cores must be >= 1, got {self.min_cores}")
        if self.fixed is not None and self.fixed < 1:
            raise ValueError(f"fixed must be >= 1, got {self.fixed}")


class ThreadScheduler:
    """One worker's thread count: floor rules, then a hill climb on measured cost per drafted token."""

    def __init__(self, policy: ThreadPolicy, cores: int):
        self.policy = policy
        self.cores = max(1, cores)
        self.floor = min(policy.min_cores, self.cores)
        self.current = self.cores
        self.cost: dict[int, float] = {}  # threads -> EWMA compute seconds per drafted token
        self._calls = 0
        self._trial: int | None = None
        self._home = self.current
        self._direction = -1
        self._explore_after = TRIAL_CALLS  # probe early: a shared host can make all-cores far too slow

    def observe(self, threads: int | None, seconds: float, tokens: int, abandoned: bool = False) -> None:
        """A call drafted ``tokens`` tokens in ``seconds`` of worker compute with ``threads`` threads.

        ``abandoned``: the call was given up on, ``seconds`` is a lower bound; unless a trial is
        running, the next call probes another thread count at once.
        """
        if threads is None or tokens <= 0 or seconds <= 0:
            return
        c = seconds / tokens
        prev = self.cost.get(threads)
        self.cost[threads] = c if prev is None else prev + COST_ALPHA * (c - prev)
        self._calls += 1
        if abandoned and self._trial is None:
            self._calls = max(self._calls, self._explore_after)

    def choose(self, busy: float, queued: int) -> int:
        p = self.policy
        if p.fixed is not None:
            return min(p.fixed, self.cores)
        if queued == 0 or busy > p.busy_threshold:
            return self.floor
        if self.floor == self.cores:
            return self.cores
        if self._trial is not None:
            clear_loss = self.cost.get(self._trial, 0.0) > CLEAR_LOSS * self.cost.get(self._home, math.inf)
            if self._calls < TRIAL_CALLS and not clear_loss:
                return self._trial
            self._conclude_trial()
        elif self._calls >= self._explore_after:
            trial = self._neighbour()
            if trial is not None:
                self._trial, self._home, self._calls = trial, self.current, 0
                self.cost.pop(trial, None)  # conditions change: measure it afresh
                return trial
            self._calls = 0
        return self.current

    def _neighbour(self) -> int | None:
        step = max(1, self.current // 4)
        for direction in (self._direction, -self._direction):
            candidate = min(self.cores, max(self.floor, self.current + direction * step))
            if candidate != self.current:
                self._direction = direction
                return candidate
        return None

    def _conclude_trial(self) -> None:
        trial, home = self._trial, self._home
        t, h = self.cost.get(trial, math.inf), self.cost.get(home, math.inf)
        keep = t <= h * (1 + FEWER_THREADS_TOLERANCE) if trial < home else t < h * (1 - FEWER_THREADS_TOLERANCE)
        if keep:
            self.current = trial
            self._explore_after = EXPLORE_EVERY
        else:
            self.current = home
            self._direction = -self._direction  # the other way next time
            self._explore_after = min(max(self._explore_after * 2, EXPLORE_EVERY), EXPLORE_EVERY * MAX_EXPLORE_BACKOFF)
        self._trial, self._calls = None, 0


class BusyMeter:
    """EWMA of the target's busy fraction over step cycles."""

    def __init__(self, alpha: float = 0.2):
        self.alpha = alpha
        self.value = 0.0
        self._last_start: float | None = None
        self._last_end: float | None = None
        self._forward = 0.0  # engine-reported forward seconds since the last cycle

    def observe_forward(self, seconds: float) -> None:
        """The engine's target forward time (preferred over the cycle estimate when reported)."""
        self._forward += seconds

    def on_draft(self, start: float, end: float) -> None:
        """A drafting call spanned [start, end]; the time since the previous call's end was the target's."""
        if self._last_start is not None and self._last_end is not None:
            cycle = start - self._last_start
            if 0 < cycle < IDLE_GAP_S:
                target = self._forward if self._forward > 0 else start - self._last_end
                frac = min(1.0, max(0.0, target / cycle))
                self.value += self.alpha * (frac - self.value)
        self._forward = 0.0
        self._last_start, self._last_end = start, end
