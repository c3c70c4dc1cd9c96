"""Read-only views of what the engine owns, for speculation and drafters.

Speculation and drafters read requests and the scheduler but never own them:
these protocols say what they may read, so that neither imports the engine.
:class:`hyspec.engine.sequence.Sequence` and :class:`hyspec.engine.scheduler.Scheduler`
are the implementations; a remote draft worker's ``ShadowSequence`` implements
:class:`SequenceView` from the messages it receives.  Two proposers read a little
more where they run beside the engine (EAGLE the canary ``arm`` in ``on_commit``,
suffix decoding ``output_token_ids`` in ``on_finish``): :class:`EngineSequenceView`'s.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from collections.abc import Collection, Sequence

    import torch

    from hyspec.kv.sequence_kv import SequenceKV
    from hyspec.seam.processors import TokenProcessor


class SamplingView(Protocol):
    """How a request samples (``hyspec.SamplingParams``; a remote worker's ``SamplingSpec``)."""

    @property
    def temperature(self) -> float: ...

    @property
    def top_k(self) -> int: ...

    @property
    def top_p(self) -> float: ...

    @property
    def min_p(self) -> float: ...

    @property
    def greedy(self) -> bool: ...


class SequenceView(Protocol):
    """One request as a drafter sees it: its tokens so far and how it samples.

    Invariant (``Sequence``'s): the target's KV holds every token but the last,
    which is the root of the next draft tree.
    """

    @property
    def request_id(self) -> str: ...

    @property
    def token_ids(self) -> list[int]: ...  # prompt + output: read it, never change it

    @property
    def params(self) -> SamplingView: ...

    @property
    def generator(self) -> "torch.Generator | None": ...  # the request's own (seeded requests)

    @property
    def last_token(self) -> int: ...

    @property
    def num_cached(self) -> int: ...

    @property
    def in_prefill(self) -> bool: ...


class EngineSequenceView(SequenceView, Protocol):
    """A request as the target-side speculation strategy sees it (only ``Sequence`` implements it)."""

    @property
    def kv(self) -> "SequenceKV": ...  # the accept stage commits the kept tree rows in it

    #: canary arm: "spec" may speculate, "control" never does (the one field the strategy writes, in admit)
    arm: str

    @property
    def output_token_ids(self) -> list[int]: ...

    #: the request's logits processors (hyspec.seam.processors): verification applies them to every tree row
    @property
    def processors(self) -> "Sequence[TokenProcessor]": ...


class SchedulerLimits(Protocol):
    @property
    def max_num_seqs(self) -> int: ...


class SchedulerView(Protocol):
    """The scheduler's queues, as the strategy's plan stage reads them (``hyspec.engine.scheduler.Scheduler``)."""

    @property
    def config(self) -> SchedulerLimits: ...

    @property
    def running(self) -> list[EngineSequenceView]: ...  # oldest first

    @property
    def waiting(self) -> Collection[EngineSequenceView]: ...  # in admission order

    @property
    def admission_blocked(self) -> bool: ...  # the last schedule could not admit a waiting request

    @property
    def preempted_last(self) -> int: ...  # sequences the last schedule preempted


class ScheduleView(Protocol):
    """One step's schedule, as the strategy's draft stage reads it (``hyspec.engine.scheduler.SchedulerOutput``)."""

    @property
    def decodes(self) -> list[EngineSequenceView]: ...  # each feeds its last token (+ drafts)

    @property
    def prefills(self) -> list[tuple[EngineSequenceView, int]]: ...  # (sequence, tokens this chunk)

    @property
    def preempted(self) -> list[EngineSequenceView]: ...  # their KV was dropped
