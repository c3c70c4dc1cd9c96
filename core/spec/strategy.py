"""What the engine asks of speculation, once per step: one strategy, a few typed calls.

The engine holds a :class:`Speculation` unconditionally -- :class:`NoSpeculation`
for plain decoding, :class:`~hyspec.spec.decoder.SpecDecoder` otherwise -- and
calls it at fixed points of ``LLMEngine.step``::

    plan   = spec.plan(scheduler)          # schedule: method and draft budget -> KV lookahead
    drafts = spec.draft(plan, scheduled)   # draft: a DraftTree per decoding sequence, or none
    run    = <one target forward over every row, trees included>
    accepted = spec.accept(run, drafts)    # accept: verify the trees, commit their KV
    spec.observe(run, accepted)            # learn: hidden states to drafters, step cost, metrics

Every record that crosses the seam is a typed value from :mod:`hyspec.seam.step`
(``StepPlan``, ``Drafts``, ``TargetRun``, ``Accepted``); nothing is set on the
strategy for a later call to read.  The strategy sees the engine's scheduler and
sequences through the read-only views of :mod:`hyspec.seam.views`, so this
package never imports the engine.  Request lifecycle: :meth:`Speculation.admit`
when a request is queued, :meth:`Speculation.release` when it ends.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

# NONE, PLAIN and StepPlan are re-exported: callers name them as hyspec.spec.strategy's
from hyspec.seam.step import NONE, PLAIN, Accepted, Drafts, StepPlan, TargetRun
from hyspec.seam.views import EngineSequenceView, SchedulerView, ScheduleView

__all__ = ["NONE", "PLAIN", "Accepted", "Drafts", "NoSpeculation", "Speculation", "StepPlan"]


class Speculation(ABC):
    """What the engine asks of speculation, once per step."""

    #: True when this strategy may draft (False: plain decoding; callers skip speculative metrics).
    enabled: bool = True
    #: Target layers whose outputs some drafter conditions on (the forward keeps them).
    aux_layers: tuple[int, ...] = ()

    @abstractmethod
    def plan(self, scheduler: SchedulerView) -> StepPlan:
        """Choose this step's method and budget (before scheduling, which reserves the lookahead)."""

    @abstractmethod
    def draft(self, plan: StepPlan, scheduled: ScheduleView) -> Drafts:
        """Forget preempted sequences, then draft for the scheduled decodes."""

    @abstractmethod
    def abandon(self, drafts: Drafts, cause: str) -> Drafts:
        """The forward refused the drafts (``cause``, e.g. a KV ownership violation): count them, drop them."""

    @abstractmethod
    def accept(self, run: TargetRun, drafts: Drafts) -> Accepted:
        """Verify every tree of ``run`` losslessly and commit the accepted nodes' KV."""

    @abstractmethod
    def observe(self, run: TargetRun, accepted: Accepted) -> None:
        """After the step: committed hidden states to the drafters, the forward's cost to the controller."""

    def admit(self, seq: EngineSequenceView) -> None:
        """A request was queued."""

    def release(self, seq: EngineSequenceView) -> None:
        """A request ended (finished or aborted): drop what is held for it."""

    def forget_shared_history(self) -> None:
        """Every proposer forgets what it learnt across requests (Proposer.forget_shared_history)."""

    def close(self) -> None:
        """Stop threads and workers."""

    def register_prometheus(self, registry: Any = None) -> Any:
        return None


class NoSpeculation(Speculation):
    """Plain decoding: every decode is a one-token step."""

    enabled = False

    def plan(self, scheduler: SchedulerView) -> StepPlan:
        return PLAIN

    def draft(self, plan: StepPlan, scheduled: ScheduleView) -> Drafts:
        return Drafts(plan)

    def abandon(self, drafts: Drafts, cause: str) -> Drafts:
        return Drafts(drafts.plan)

    def accept(self, run: TargetRun, drafts: Drafts) -> Accepted:
        return Accepted()

    def observe(self, run: TargetRun, accepted: Accepted) -> None:
        pass
