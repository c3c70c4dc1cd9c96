"""Adaptive resource partitioning: how many threads each draft worker may use.

Field experience behind the defaults: a scheduler that cut CPU drafters to
2 cores whenever the accelerator was over 80 % busy left their CPUs 25-35 %
used; a 0.95 threshold plus a floor of cores gave +22 % throughput.  The
cut exists for workers that share a host with the target (the target's host
threads launch kernels and sample): only a target that is really saturated
takes cores back, and never below the floor.

Each step the target side picks a thread count per worker (it travels in
the draft call; the worker applies it with ``torch.set_num_threads`` on its
compute thread):

* no sequences queued for the worker -> the floor (idle workers hold little);
* target busy above ``busy_threshold`` -> the floor;
* otherwise from the drafting queue's pressure, the worker's compute time
  per call against the deadline: above half the deadline, grow by half
  (drafts are about to be late); under 15 %, give one thread back (small
  drafts do not scale and spare cores serve other work); in between, hold.

``busy`` is the fraction of wall time the target spends in its own work.
:class:`BusyMeter` measures it from the step cycle as seen by the proposer
(the time between drafting calls that is not spent waiting for drafts), or
from forward times when the engine reports them.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

GROW_ABOVE = 0.5  # of the deadline
SHRINK_BELOW = 0.15
IDLE_GAP_S = 1.0  # a longer pause between steps is the engine idling, not the target working


@dataclass(frozen=True)
class ThreadPolicy:
    busy_threshold: float = 0.95
    min_cores: int = 4
    deadline_s: float = 0.05
    fixed: int | None = None  # a fixed cap instead of adapting (the baseline the field report fixed)

    def __post_init__(self) -> None:
        if not 0.0 < self.busy_threshold <= 1.0:
            raise ValueError(f"busy_threshold must be in (0, 1], got {self.busy_threshold}")
        if self.min_cores < 1 or self.deadline_s <= 0:
            raise ValueError("min_cores must be >= 1 and deadline_s > 0")
        if self.fixed is not None and self.fixed < 1:
            raise ValueError(f"fixed must be >= 1, got {self.fixed}")


def choose_threads(policy: ThreadPolicy, current: int, cores: int, busy: float, queued: int,
                   draft_seconds: float) -> int:
    """The worker's next thread count, in [1, cores]."""
    cores = max(1, cores)
    if policy.fixed is not None:
        return min(policy.fixed, cores)
    floor = min(policy.min_cores, cores)
    if queued == 0 or busy > policy.busy_threshold:
        return floor
    current = min(max(current, floor), cores)
    pressure = draft_seconds / policy.deadline_s
    if pressure > GROW_ABOVE:
        return min(cores, current + max(1, math.ceil(current / 2)))
    if pressure < SHRINK_BELOW:
        return max(floor, current - 1)
    return current


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
