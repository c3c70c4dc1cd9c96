"""Fragmentation of the paged pool, defined so that it can be acted on, and compaction.

Paging leaves no external fragmentation to speak of (any free page serves any sequence), and a
partly filled last page is the price of paging, not waste to reclaim.  What *can* be wasted is
pages a sequence holds beyond what its kept entries need: a reservation that was never
consumed (a lookahead for drafts that did not come, a chunk that was rescheduled), or a draft
cache that kept pages after a rollback.  So:

    fragmentation index = pages held by live sequences / pages their kept entries need

summed over every layout (target and drafters): 1.0 is no waste, 1.2 is a fifth of the held
pages holding nothing.  Compaction frees those pages (``SequenceKV.trim``); the next step
reserves what it needs again, so it changes no output.  The monitor compacts when the index has
stayed above ``threshold`` for ``window_s`` (the operator table's "> 1.2 for 5 minutes").
"""
from __future__ import annotations

import logging
import time
from typing import Callable

from hyspec.errors import ConfigError
from hyspec.kv.pool import KVPool

log = logging.getLogger(__name__)


def fragmentation_index(pool: KVPool) -> float:
    held = needed = 0
    for kv in list(pool.holders):
        if kv.pages:
            held += len(kv.pages)
            needed += -(-kv.num_tokens // kv.layout.block_size)
    if held == 0:
        return 1.0
    return held / max(needed, 1)


def compact(pool: KVPool) -> int:
    """Free every live sequence's pages past its kept entries; returns the pages freed."""
    return sum(kv.trim() for kv in list(pool.holders))


class FragmentationMonitor:
    """Called between engine steps: measures the index and compacts after a sustained excess."""

    def __init__(self, pool: KVPool, threshold: float = 1.2, window_s: float = 300.0,
                 clock: Callable[[], float] = time.monotonic):
        if not isinstance(threshold, (int, float)) or isinstance(threshold, bool) or not 1.0 < threshold <= 100.0:
            raise ConfigError("fragmentation_threshold", f"must be in (1, 100], got {threshold!r}")
        if not isinstance(window_s, (int, float)) or isinstance(window_s, bool) or not 0.0 < window_s <= 86_400.0:
            raise ConfigError("fragmentation_window_s", f"must be in (0, 86400] seconds, got {window_s!r}")
        self.pool = pool
        self.threshold = float(threshold)
        self.window_s = float(window_s)
        self.clock = clock
        self.index = 1.0
        self.compactions = 0
        self.pages_compacted = 0
        self._above_since: float | None = None

    def tick(self) -> int:
        """Measure; compact if the index stayed above the threshold for the window.  Returns pages freed."""
        self.index = fragmentation_index(self.pool)
        if self.index <= self.threshold:
            self._above_since = None
            return 0
        now = self.clock()
        if self._above_since is None:
            self._above_since = now
        if now - self._above_since < self.window_s:
            return 0
        before = self.index
        freed = compact(self.pool)
        self.index = fragmentation_index(self.pool)
        self._above_since = None
        self.compactions += 1
        self.pages_compacted += freed
        log.warning("KV fragmentation index %.2f above %.2f for %.0f s: compacted, %d pages freed (index now %.2f)",
                    before, self.threshold, self.window_s, freed, self.index)
        return freed
