"""Draft-quality monitor: warns when a method drafts badly or erratically.

Two conditions, per method, from the per-step acceptance rate (accepted /
drafted tokens of that step):

- ``low_acceptance``: the EWMA of the rate has stayed below
  ``quality.min_acceptance`` for ``quality.window`` consecutive steps (a
  drafter that no longer matches its target: wrong checkpoint, domain drift);
- ``unstable_acceptance``: the standard deviation of the rate over the last
  ``window`` steps exceeds ``quality.max_std`` (a drafter that is good on some
  requests and useless on others: a routing or rules problem).

Each is logged once when it starts (``logging.warning``) and once when it
ends (``logging.info``), not every step, and mirrored into ``SpecMetrics``
(a gauge while it lasts and a counter of warnings).  The EWMA uses
``controller.ewma_alpha`` so the monitor and the controller see one estimate.
"""
from __future__ import annotations

import logging
import math
from collections import deque
from dataclasses import dataclass

from hyspec.errors import HyspecError
from hyspec.spec.config import QualityConfig, SpeculativeConfig
from hyspec.spec.metrics import SpecMetrics

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class QualityState:
    method: str
    steps: int  # steps observed
    ewma: float  # EWMA of per-step acceptance
    std: float  # over the last `window` steps (0 until the window is full)
    low_acceptance: bool
    unstable: bool


class _Track:
    __slots__ = ("window", "sum", "sumsq", "ewma", "steps", "low_streak", "low", "unstable")

    def __init__(self, size: int) -> None:
        self.window: deque[float] = deque(maxlen=size)
        self.sum = self.sumsq = 0.0
        self.ewma = math.nan
        self.steps = self.low_streak = 0
        self.low = self.unstable = False


class DraftQualityMonitor:
    """Watches each method's acceptance; warns on transitions into and out of bad quality."""

    def __init__(self, config: SpeculativeConfig | QualityConfig, metrics: SpecMetrics | None = None,
                 ewma_alpha: float | None = None):
        if isinstance(config, SpeculativeConfig):
            quality, alpha = config.quality, config.controller.ewma_alpha
        elif isinstance(config, QualityConfig):
            quality, alpha = config, 0.05
        else:
            raise HyspecError(f"DraftQualityMonitor needs a SpeculativeConfig or QualityConfig, "
                              f"got {type(config).__name__}")
        self.min_acceptance = quality.min_acceptance
        self.max_std = quality.max_std
        self.window = quality.window
        self.alpha = alpha if ewma_alpha is None else ewma_alpha
        if not 0.0 < self.alpha <= 1.0:
            raise HyspecError(f"DraftQualityMonitor: ewma_alpha must be in (0, 1], got {self.alpha}")
        self.metrics = metrics
        self._tracks: dict[str, _Track] = {}

    def observe(self, method: str, accepted_tokens: int, draft_tokens: int) -> QualityState:
        """One verified step of ``method``; steps that drafted nothing are ignored."""
        if draft_tokens < 0 or not 0 <= accepted_tokens <= max(draft_tokens, 0):
            raise HyspecError(f"DraftQualityMonitor.observe({method!r}): {accepted_tokens} accepted of "
                              f"{draft_tokens} drafted")
        t = self._tracks.get(method)
        if t is None:
            t = self._tracks[method] = _Track(self.window)
        if draft_tokens == 0:
            return self._state(method, t)
        rate = accepted_tokens / draft_tokens
        t.steps += 1
        t.ewma = rate if t.steps == 1 else t.ewma + self.alpha * (rate - t.ewma)
        if len(t.window) == self.window:
            old = t.window[0]
            t.sum -= old
            t.sumsq -= old * old
        t.window.append(rate)
        t.sum += rate
        t.sumsq += rate * rate
        t.low_streak = t.low_streak + 1 if t.ewma < self.min_acceptance else 0

        low = t.low_streak >= self.window
        unstable = len(t.window) == self.window and self._std(t) > self.max_std
        if low != t.low:
            t.low = low
            self._transition(method, "low_acceptance", low,
                             f"EWMA acceptance {t.ewma:.3f} below {self.min_acceptance} for {self.window} steps")
        if unstable != t.unstable:
            t.unstable = unstable
            self._transition(method, "unstable_acceptance", unstable,
                             f"acceptance std {self._std(t):.3f} over {self.window} steps above {self.max_std}")
        return self._state(method, t)

    def state(self, method: str) -> QualityState | None:
        t = self._tracks.get(method)
        return None if t is None else self._state(method, t)

    def reset(self, method: str) -> None:
        """Forget a method (e.g. after its drafter was reloaded); clears its flags."""
        t = self._tracks.pop(method, None)
        if t is not None and self.metrics is not None:
            for reason, flagged in (("low_acceptance", t.low), ("unstable_acceptance", t.unstable)):
                if flagged:
                    self.metrics.set_quality(method, reason, False)

    # -- internals ---------------------------------------------------------------------
    def _transition(self, method: str, reason: str, degraded: bool, detail: str) -> None:
        if degraded:
            logger.warning("draft quality: method %r %s (%s)", method, reason.replace("_", " "), detail)
        else:
            logger.info("draft quality: method %r recovered from %s", method, reason.replace("_", " "))
        if self.metrics is not None:
            self.metrics.set_quality(method, reason, degraded)

    def _std(self, t: _Track) -> float:
        n = len(t.window)
        if n < 2:
            return 0.0
        mean = t.sum / n
        # running sums can round a zero variance slightly negative
        return math.sqrt(max(0.0, t.sumsq / n - mean * mean))

    def _state(self, method: str, t: _Track) -> QualityState:
        std = self._std(t) if len(t.window) == self.window else 0.0
        return QualityState(method, t.steps, t.ewma, std, t.low, t.unstable)
