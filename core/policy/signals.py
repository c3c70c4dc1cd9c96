"""The live values the hybrid dispatcher decides on, one record per step.

These are also the names a rule condition may use (``SIGNAL_NAMES`` and
``accept_rate.<method>`` / ``goodput.<method>``), so renaming a field here
renames it in every rule file: do not.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from hyspec.drafters.methods import NAMES, NONE  # noqa: F401  (NONE: re-exported, plain decoding)
from hyspec.errors import HyspecError

#: Drafting methods a rule may name: the keys of the methods' table (hyspec.drafters.methods), a live
#: view, so a method registered later is in it; "none" means plain decoding.
METHODS = NAMES

#: Scalar signals a condition may name.
SIGNAL_NAMES = (
    "context_length",
    "max_context_length",
    "batch_size",
    "mem_usage",
    "load",
    "queue_depth",
    "remote_health",
    "match_length",
)
#: ``match_length`` is measured up to this many tokens: enough to tell the bandit's buckets apart,
#: and it bounds the per-step cost of measuring it
MATCH_LENGTH_CAP = 16
#: Per-method signals, written ``accept_rate.eagle`` in a condition.
PER_METHOD_SIGNALS = ("accept_rate", "goodput")


@dataclass(slots=True)
class StepSignals:
    """What the engine knows at the start of a step.

    ``context_length`` is the MEAN number of tokens (prompt + generated) per
    sequence in the batch: the method applies to the whole batch, and one long
    outlier in a large batch should not move every sequence to a long-context
    drafter.  ``max_context_length`` is the longest sequence, for rules that
    care about the worst case (it defaults to ``context_length``, i.e. a batch
    of one).

    ``match_length`` is the longest copy a model-free drafter (suffix, else ngram) finds for any
    sequence of the batch right now: how many of its last tokens occur earlier in its own tokens or
    (suffix) in earlier responses, capped at ``MATCH_LENGTH_CAP``.  ``None`` when no such drafter is
    loaded; a condition then reads it as NaN.  It tells a step that can copy (an agent re-running a
    step, an edit of pasted code) from one that cannot, before anything is drafted.

    ``accept_rate[m]`` is the EWMA acceptance rate of method ``m`` (0..1) and
    ``goodput[m]`` its EWMA committed tokens per second; a method with no data
    yet is absent, and a condition reads it as NaN, so every comparison with it
    is false (except ``!=``): a rule on a method's acceptance does not fire
    before that method has been measured.

    The record is validated at construction.  An engine that reuses one record
    and overwrites fields in place each step skips that validation and owns
    the ranges.
    """

    context_length: float = 0.0
    batch_size: int = 0
    mem_usage: float = 0.0  # KV pool blocks in use / total, 0..1
    load: float = 0.0  # the engine's own load figure, 0..1 (see hyspec.policy.load)
    queue_depth: int = 0  # requests waiting for admission
    remote_health: float = 1.0  # share of recent remote-drafter pings answered; 1 without one
    max_context_length: float | None = None  # None -> context_length
    match_length: int | None = None  # None: no model-free drafter loaded to measure it
    accept_rate: dict[str, float] = field(default_factory=dict)
    goodput: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.max_context_length is None:
            self.max_context_length = self.context_length
        if not self.context_length >= 0:  # written so that NaN fails too
            raise HyspecError(f"StepSignals.context_length must be >= 0, got {self.context_length}")
        if not self.max_context_length >= self.context_length:
            raise HyspecError(
                f"StepSignals.max_context_length ({self.max_context_length}) must be >= "
                f"context_length ({self.context_length}), which is the batch mean"
            )
        if self.match_length is not None and not 0 <= self.match_length:
            raise HyspecError(f"StepSignals.match_length must be >= 0 or None, got {self.match_length}")
        if self.batch_size < 0 or self.queue_depth < 0:
            raise HyspecError(
                f"StepSignals.batch_size and queue_depth must be >= 0, got {self.batch_size}, {self.queue_depth}"
            )
        for name in ("mem_usage", "load", "remote_health"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise HyspecError(f"StepSignals.{name} must be in [0, 1], got {value}")
        _check_per_method("accept_rate", self.accept_rate, upper=1.0)
        _check_per_method("goodput", self.goodput, upper=math.inf)


def _check_per_method(name: str, values: dict[str, float], upper: float) -> None:
    for method, value in values.items():
        if method not in METHODS:
            raise HyspecError(f"StepSignals.{name} has unknown method {method!r}; methods are {list(METHODS)}")
        if not 0.0 <= value <= upper:
            raise HyspecError(f"StepSignals.{name}[{method!r}] must be in [0, {upper}], got {value}")
