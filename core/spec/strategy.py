"""The seam between the engine and speculation: one strategy, a few typed calls.

The engine holds a :class:`Speculation` unconditionally -- :class:`NoSpeculation`
for plain decoding, :class:`~hyspec.spec.decoder.SpecDecoder` otherwise -- and
calls it at fixed points of ``LLMEngine.step``::

    plan   = spec.plan(scheduler)          # schedule: method and draft budget -> KV lookahead
    drafts = spec.draft(plan, scheduled)   # draft: a DraftTree per decoding sequence, or none
    run    = <one target forward over every row, trees included>
    accepted = spec.accept(run, drafts)    # accept: verify the trees, commit their KV
    spec.observe(run, accepted)            # learn: hidden states to drafters, step cost, metrics

Every record that crosses the seam is a typed value; nothing is set on the
strategy for a later call to read.  Request lifecycle: :meth:`Speculation.admit`
when a request is queued, :meth:`Speculation.release` when it ends.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from hyspec.engine.model_runner import ALL_LOGITS, Feed
from hyspec.engine.sequence import Sequence
from hyspec.spec.tree import DraftTree

if TYPE_CHECKING:
    from hyspec.engine.scheduler import Scheduler, SchedulerOutput
    from hyspec.engine.step import TargetRun

NONE = "none"


@dataclass(frozen=True)
class StepPlan:
    method: str  # a loaded method, or "none"
    budget: int  # draft nodes per sequence (chain length for chain methods); 0 = plain step
    lookahead: int  # KV entries each decode reserves beyond its root
    batch_size: int
    reason: str = ""  # why the step is plain, for metrics ("budget_zero", "dispatcher", "load")


PLAIN = StepPlan(NONE, 0, 0, 1)


@dataclass(frozen=True)
class Drafts:
    """The step's drafts: one tree per sequence that speculates (request id -> tree)."""

    plan: StepPlan
    trees: dict[str, DraftTree] = field(default_factory=dict)
    seconds: float = 0.0  # drafting wall time

    def __bool__(self) -> bool:
        return bool(self.trees)

    def feed(self, seq: Sequence) -> Feed | None:
        """The verification feed for ``seq`` (root + draft nodes), or None when it decodes plainly."""
        tree = self.trees.get(seq.request_id)
        if tree is None:
            return None
        n = tree.num_nodes
        is_chain = bool((tree.parents == torch.arange(-1, n - 1)).all())
        return Feed(seq.kv, tree.tokens.tolist(), seq.num_cached, depths=tree.depths.tolist(),
                    tree_mask=None if is_chain else tree.ancestor_mask(), logits=ALL_LOGITS)


@dataclass(frozen=True)
class Accepted:
    """What verification kept: tokens to emit, and the tree rows whose KV stayed (root first)."""

    tokens: dict[str, list[int]] = field(default_factory=dict)
    kept_rows: dict[str, list[int]] = field(default_factory=dict)


class Speculation(ABC):
    """What the engine asks of speculation, once per step."""

    #: True when this strategy may draft (False: plain decoding; callers skip speculative metrics).
    enabled: bool = True
    #: Target layers whose outputs some drafter conditions on (the forward keeps them).
    aux_layers: tuple[int, ...] = ()

    @abstractmethod
    def plan(self, scheduler: "Scheduler") -> StepPlan:
        """Choose this step's method and budget (before scheduling, which reserves the lookahead)."""

    @abstractmethod
    def draft(self, plan: StepPlan, scheduled: "SchedulerOutput") -> Drafts:
        """Forget preempted sequences, then draft for the scheduled decodes."""

    @abstractmethod
    def abandon(self, drafts: Drafts, cause: str) -> Drafts:
        """The forward refused the drafts (``cause``, e.g. a KV ownership violation): count them, drop them."""

    @abstractmethod
    def accept(self, run: "TargetRun", drafts: Drafts) -> Accepted:
        """Verify every tree of ``run`` losslessly and commit the accepted nodes' KV."""

    @abstractmethod
    def observe(self, run: "TargetRun", accepted: Accepted) -> None:
        """After the step: committed hidden states to the drafters, the forward's cost to the controller."""

    def admit(self, seq: Sequence) -> None:
        """A request was queued."""

    def release(self, seq: Sequence) -> None:
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

    def plan(self, scheduler: "Scheduler") -> StepPlan:
        return PLAIN

    def draft(self, plan: StepPlan, scheduled: "SchedulerOutput") -> Drafts:
        return Drafts(plan)

    def abandon(self, drafts: Drafts, cause: str) -> Drafts:
        return Drafts(drafts.plan)

    def accept(self, run: "TargetRun", drafts: Drafts) -> Accepted:
        return Accepted()

    def observe(self, run: "TargetRun", accepted: Accepted) -> None:
        pass
