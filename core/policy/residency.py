"""Drafters that step aside when the KV pool runs short, and come back when it has not for a while.

Pressure (judged once per step, before scheduling) is any of: requests waiting that the pool
could not admit in the last schedule, a preemption in it, or free pages under
``memory_pressure.free_floor``.  Once pressure has lasted ``window_s``, the resident drafter with
the lowest measured goodput (``SpecMetrics.goodput``: tokens per second of its speculative
steps; never measured counts as 0) is released: its KV pages are freed for every request, its
pool reclaimer removed, its weights dropped.  Steps that would have used it decode plainly
(counted as ``memory_pressure`` rejections), which changes nothing in the output.  After
``cooldown_s`` without pressure it is rebuilt from its method spec; a rebuild that fails is
logged with its reason and retried after another cool-down.

Only drafters that hold weights or KV (EAGLE, MTP, DFlash, DSpark, draft_model) can be released;
ngram holds neither.  A remote drafter's memory is on its workers: pressure here does not touch
it (logged once).  On a GPU the weights' memory returns to the allocator, not to the KV pool,
whose size is fixed at start-up; what the pool gets back is the drafter's KV pages.
"""
from __future__ import annotations

import gc
import logging
import time
from typing import TYPE_CHECKING, Callable

from hyspec.seam.proposer import Proposer
from hyspec.spec.ops_config import MemoryPressureConfig

if TYPE_CHECKING:
    from hyspec.kv.pool import KVPool
    from hyspec.seam.views import SchedulerView
    from hyspec.spec.metrics import SpecMetrics

log = logging.getLogger(__name__)


def holds_memory(proposer: Proposer) -> bool:
    """True when releasing ``proposer`` frees something: torch modules or a KV layout of its own."""
    from torch import nn

    fields = getattr(proposer, "__dict__", {})
    return any(isinstance(v, nn.Module) for v in fields.values()) or "layout" in fields or "layouts" in fields


class DrafterResidency:
    """Decides, once per step, whether a drafter is released or reloaded; does it through callbacks."""

    def __init__(self, config: MemoryPressureConfig, metrics: "SpecMetrics", remote: bool = False,
                 clock: Callable[[], float] = time.monotonic):
        self.config = config
        self.metrics = metrics
        self.remote = remote
        self.clock = clock
        self.released: set[str] = set()
        self._pressure_since: float | None = None
        self._last_pressure: float | None = None  # the last step that saw pressure
        self._calm_since: float | None = None
        self._said_remote = False

    def under_pressure(self, scheduler: "SchedulerView", pool: "KVPool") -> bool:
        blocked = getattr(scheduler, "admission_blocked", False) or getattr(scheduler, "preempted_last", 0) > 0
        return blocked or pool.num_free < self.config.free_floor * pool.num_pages

    def step(self, pressure: bool, proposers: dict[str, Proposer],
             release: Callable[[str], None], reload: Callable[[str], None]) -> None:
        if not self.config.enabled:
            return
        now = self.clock()
        if pressure:
            self._calm_since = None
            self._last_pressure = now
            if self._pressure_since is None:
                self._pressure_since = now
            if now - self._pressure_since < self.config.window_s:
                return
            self._pressure_since = now  # a further release needs pressure for another window
            if self.remote:
                if not self._said_remote:
                    log.info("KV pressure: the drafter runs on remote workers, local memory is unaffected; "
                             "nothing to release")
                    self._said_remote = True
                return
            candidates = [m for m, p in proposers.items() if m not in self.released and holds_memory(p)]
            if not candidates:
                return
            victim = min(candidates, key=lambda m: (self.metrics.goodput(m), m))
            log.warning("KV pressure for %g s: releasing the %s drafter (goodput %.1f tok/s, the least useful); "
                        "its steps decode plainly", self.config.window_s, victim, self.metrics.goodput(victim))
            release(victim)
            self.released.add(victim)
            self.metrics.ops.set_resident(victim, False)
            self.metrics.ops.record_transition(victim, "released")
            return
        self._pressure_since = None
        if not self.released:
            return
        if self._calm_since is None:  # calm began after the last pressured step (idle time counts)
            self._calm_since = self._last_pressure if self._last_pressure is not None else now
        if now - self._calm_since < self.config.cooldown_s:
            return
        self._calm_since = now  # the next reload (or a retry) waits another cool-down
        method = sorted(self.released)[0]
        try:
            reload(method)
        except Exception as exc:  # stay plain, say why, retry later
            log.warning("reloading the %s drafter failed (%s: %s); decoding plainly, retrying in %g s",
                        method, type(exc).__name__, exc, self.config.cooldown_s)
            self.metrics.ops.record_transition(method, "reload_failed")
            return
        log.info("no KV pressure for %g s: the %s drafter is back", self.config.cooldown_s, method)
        self.released.discard(method)
        self.metrics.ops.set_resident(method, True)
        self.metrics.ops.record_transition(method, "reloaded")


def release_proposer(proposer: Proposer, pool: "KVPool", sequences: list) -> None:
    """Free everything ``proposer`` holds: every sequence's draft state and KV, its reclaimer, its threads."""
    for seq in sequences:
        proposer.on_finish(seq)
    pool.remove_reclaimers_of(proposer)
    proposer.close()
    gc.collect()
    _return_heap_to_os()


def _return_heap_to_os() -> None:
    """glibc keeps freed CPU tensors' memory in its heap; malloc_trim hands it back (RSS drops)."""
    import ctypes
    import sys

    if not sys.platform.startswith("linux"):
        return
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc (musl): nothing to trim
        pass
