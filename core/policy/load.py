"""Load-based fallback: stop speculating while the system is loaded.

Speculation spends target compute on tokens that may be rejected; when the
batch is full, the KV pool is nearly used up or requests are queueing, that
compute is better spent on plain decoding of more sequences.  The fallback
engages when the load signal EXCEEDS ``threshold`` and releases only when it
drops BELOW ``resume_threshold``: the gap (hysteresis) keeps a load hovering
around one value from flipping the method every step.

Load signals (``load_signal``):

- ``"load"``: ``StepSignals.load`` as the engine reports it;
- ``"batch_occupancy"``: ``batch_size / max_batch_size``;
- ``"kv_usage"``: ``StepSignals.mem_usage`` (KV pool blocks in use);
- ``"queue_depth"``: ``min(1, queue_depth / queue_capacity)``;
- ``"max"`` (default, as in speculative_config): the largest of ``load``,
  ``kv_usage`` and, where their normaliser (``max_batch_size`` /
  ``queue_capacity``) is given, ``batch_occupancy`` and ``queue_depth``: any
  saturated resource makes drafting a loss.
"""
from __future__ import annotations

from typing import Any, Callable

from hyspec.errors import ConfigError

LOAD_SIGNALS = ("load", "batch_occupancy", "kv_usage", "queue_depth", "max")


class LoadFallback:
    """Hysteresis on one load figure; ``update(signals)`` says whether to fall back."""

    __slots__ = ("threshold", "resume_threshold", "signal", "_measure", "active", "last_load", "engagements")

    def __init__(
        self,
        threshold: float = 0.75,
        resume_threshold: float = 0.6,
        signal: str = "max",
        max_batch_size: int | None = None,
        queue_capacity: int | None = None,
    ):
        if not 0.0 < threshold <= 1.0:
            raise ConfigError("hybrid.load_threshold", f"must be in (0, 1], got {threshold}")
        if not 0.0 <= resume_threshold < threshold:
            raise ConfigError(
                "hybrid.load_resume_threshold",
                f"must be in [0, load_threshold={threshold}), got {resume_threshold}: "
                "speculation resumes only below it, so it must sit under the threshold",
            )
        self.threshold = threshold
        self.resume_threshold = resume_threshold
        self.signal = signal
        self._measure = _measure_for(signal, max_batch_size, queue_capacity)
        self.active = False  # True: speculation is off
        self.last_load = 0.0
        self.engagements = 0  # times the fallback switched speculation off

    def measure(self, signals: Any) -> float:
        """The configured load figure (0..1) for ``signals`` (a StepSignals)."""
        return self._measure(signals)

    def update(self, signals: Any) -> bool:
        """Feed one step's signals; return True when this step must not speculate."""
        load = self._measure(signals)
        self.last_load = load
        if self.active:
            if load < self.resume_threshold:
                self.active = False
        elif load > self.threshold:
            self.active = True
            self.engagements += 1
        return self.active


def _measure_for(signal: str, max_batch_size: int | None, queue_capacity: int | None) -> Callable[[Any], float]:
    if max_batch_size is not None and max_batch_size < 1:
        raise ConfigError("hybrid.max_batch_size", f"must be >= 1, got {max_batch_size}")
    if queue_capacity is not None and queue_capacity < 1:
        raise ConfigError("hybrid.queue_capacity", f"must be >= 1, got {queue_capacity}")

    def batch_occupancy(s: Any) -> float:
        return min(1.0, s.batch_size / max_batch_size)

    def queue_fill(s: Any) -> float:
        return min(1.0, s.queue_depth / queue_capacity)

    if signal == "load":
        return lambda s: s.load
    if signal == "kv_usage":
        return lambda s: s.mem_usage
    if signal == "batch_occupancy":
        if max_batch_size is None:
            raise ConfigError("hybrid.load_signal", "'batch_occupancy' needs max_batch_size")
        return batch_occupancy
    if signal == "queue_depth":
        if queue_capacity is None:
            raise ConfigError("hybrid.load_signal", "'queue_depth' needs queue_capacity to normalise it")
        return queue_fill
    if signal == "max":
        use_batch, use_queue = max_batch_size is not None, queue_capacity is not None

        def largest(s: Any) -> float:  # no per-step list: this runs on every decision
            value = max(s.load, s.mem_usage)
            if use_batch:
                value = max(value, batch_occupancy(s))
            if use_queue:
                value = max(value, queue_fill(s))
            return value

        return largest
    raise ConfigError("hybrid.load_signal", f"unknown load signal {signal!r}; choose one of {', '.join(LOAD_SIGNALS)}")
