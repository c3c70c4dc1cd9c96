"""The policy chain: whether a step speculates, with which method, and how deep.

Every mechanism that has a say is a :class:`Gate`: it reads the step (a
:class:`StepState`) and returns a :class:`Decision` -- the step's plan, which
ends the chain, or the method the later gates plan for -- or ``None``, no
opinion.  ``SpecDecoder.plan`` runs the chain once per step; the gates run in
the order :data:`GATE_ORDER` declares (``docs/policy.md`` shows it)::

    memory_pressure   release / reload drafters; no opinion         (residency.py)
    ttft_slo          p99 TTFT over its ceiling: plain              (slo.py)
    method            hybrid: load fallback, rules, bandit          (dispatcher.py)
                      otherwise the configured method
    nothing_to_draft  no sequence decodes: the method, budget 0
    released_method   the method's drafter was released: plain      (residency.py)
    batch_size        disable_by_batch_size reached: budget 0
    goodput_budget    the controller's budget: chain, tree, scored  (controller.py)

A gate that stops a step for a reason counts it (``SpecMetrics.record_rejection``)
itself, so every cause is counted where it is decided.  The last gate always
decides.  Which sequences may speculate at all is decided earlier, once per
request, by the canary (:class:`~hyspec.policy.canary.Canary`, at admission).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Callable, Mapping, Protocol, Sequence

from hyspec.errors import HyspecError
from hyspec.policy.signals import MATCH_LENGTH_CAP, NONE, StepSignals
from hyspec.seam.step import StepPlan

if TYPE_CHECKING:
    from hyspec.kv.pool import KVPool
    from hyspec.policy.controller import GoodputController
    from hyspec.policy.dispatcher import HybridDispatcher
    from hyspec.policy.residency import DrafterResidency
    from hyspec.policy.slo import TTFTGuard
    from hyspec.seam.proposer import Proposer
    from hyspec.seam.views import EngineSequenceView, SchedulerView
    from hyspec.spec.metrics import SpecMetrics

#: the gates' names, in the order the chain runs them
GATE_ORDER = ("memory_pressure", "ttft_slo", "method", "nothing_to_draft", "released_method", "batch_size",
              "goodput_budget")

#: drafters whose match length is the hybrid's ``match_length`` signal, in order of preference
MATCHING_METHODS = ("suffix", "ngram")


@dataclass(frozen=True)
class StepState:
    """What a gate reads about the step being planned."""

    scheduler: "SchedulerView"
    decoding: "Sequence[EngineSequenceView]"  # decoding sequences of the spec arm: those that would draft
    batch: int  # running sequences, at least 1
    #: the loaded drafters by method: the decoder's own mapping, so a drafter released by an earlier gate
    #: is gone for the later ones
    proposers: "Mapping[str, Proposer]"
    release: Callable[[str], None]  # free a drafter's weights and KV (memory pressure)
    reload: Callable[[str], None]  # rebuild a released drafter
    method: str = NONE  # the method chosen by the gates so far


@dataclass(frozen=True)
class Decision:
    """A gate's opinion: ``plan`` ends the chain; otherwise ``method`` is what the later gates plan for."""

    plan: StepPlan | None = None
    method: str | None = None

    @classmethod
    def stop(cls, plan: StepPlan) -> "Decision":
        return cls(plan=plan)

    @classmethod
    def choose(cls, method: str) -> "Decision":
        return cls(method=method)


class Gate(Protocol):
    name: str

    def __call__(self, step: StepState) -> Decision | None: ...


class PolicyChain:
    """The gates in their declared order; :meth:`plan` asks each until one decides."""

    def __init__(self, gates: Sequence[Gate]):
        names = tuple(gate.name for gate in gates)
        if names != GATE_ORDER:
            raise HyspecError(f"policy chain: gates {names}, the declared order is {GATE_ORDER}")
        self.gates = tuple(gates)

    def plan(self, step: StepState) -> StepPlan:
        for gate in self.gates:
            decision = gate(step)
            if decision is None:
                continue
            if decision.plan is not None:
                return decision.plan
            step = replace(step, method=decision.method)
        raise HyspecError(f"policy chain: no gate decided (the last, {self.gates[-1].name}, always must)")


def _plain(step: StepState, reason: str = "", method: str = NONE) -> Decision:
    return Decision.stop(StepPlan(method, 0, 0, step.batch, reason))


# -- the gates, in chain order ----------------------------------------------------------------------


class MemoryPressureGate:
    """Judge KV pressure once per step: release the least useful drafter, or reload one (residency.py)."""

    name = "memory_pressure"

    def __init__(self, residency: "DrafterResidency", pool: "KVPool"):
        self.residency = residency
        self.pool = pool

    def __call__(self, step: StepState) -> None:
        pressure = self.residency.under_pressure(step.scheduler, self.pool)
        self.residency.step(pressure, step.proposers, release=step.release, reload=step.reload)
        return None


class TTFTGate:
    """While the p99 time to first token breaches ``slo.ttft_p99_ms``, every step is plain (slo.py)."""

    name = "ttft_slo"

    def __init__(self, guard: "TTFTGuard", metrics: "SpecMetrics", charged_method: str):
        self.guard = guard
        self.metrics = metrics
        self.charged_method = charged_method  # the configured method ("hybrid" for the hybrid)

    def __call__(self, step: StepState) -> Decision | None:
        if not self.guard.speculation_off():
            return None
        if step.decoding:
            self.metrics.record_rejection("ttft_slo", self.charged_method, count=len(step.decoding))
        return _plain(step, "ttft_slo")


class ConfiguredMethodGate:
    """A single-method configuration: that method, every step."""

    name = "method"

    def __init__(self, method: str):
        self.method = method

    def __call__(self, step: StepState) -> Decision:
        return Decision.choose(self.method)


class DispatcherGate:
    """The hybrid: the dispatcher picks the method from the step's signals, or "none" (dispatcher.py)."""

    name = "method"

    def __init__(self, dispatcher: "HybridDispatcher", controller: "GoodputController", pool: "KVPool"):
        self.dispatcher = dispatcher
        self.controller = controller
        self.pool = pool

    def __call__(self, step: StepState) -> Decision:
        if not step.decoding:  # only prefills or control-arm requests: nothing to decide
            return _plain(step)
        method = self.dispatcher.choose(self.signals(step))
        if method == NONE:
            return _plain(step, "dispatcher")
        return Decision.choose(method)

    def signals(self, step: StepState) -> StepSignals:
        running = step.scheduler.running
        lengths = [len(s.token_ids) for s in running] or [0]
        dispatcher = self.dispatcher
        accept = ({method: self.controller.first_acceptance(method) for method in step.proposers}
                  if dispatcher.needs_accept_rate else {})
        return StepSignals(
            context_length=sum(lengths) / len(lengths),
            batch_size=len(running),
            mem_usage=self.pool.usage(),
            load=len(running) / step.scheduler.config.max_num_seqs,
            queue_depth=len(step.scheduler.waiting),
            remote_health=remote_health(step.proposers) if dispatcher.needs_remote_health else 1.0,
            max_context_length=float(max(lengths)),
            accept_rate=accept,
            match_length=(match_length(step.proposers, step.decoding, MATCH_LENGTH_CAP)
                          if dispatcher.needs_match_length else None),
        )


class NothingToDraftGate:
    """No sequence decodes this step (prefills only): the method stands, nothing is drafted."""

    name = "nothing_to_draft"

    def __call__(self, step: StepState) -> Decision | None:
        return None if step.decoding else _plain(step, method=step.method)


class ReleasedMethodGate:
    """The chosen method's drafter was released under memory pressure: plain until it is back."""

    name = "released_method"

    def __init__(self, metrics: "SpecMetrics"):
        self.metrics = metrics

    def __call__(self, step: StepState) -> Decision | None:
        if step.method in step.proposers:
            return None
        self.metrics.record_rejection("memory_pressure", step.method, count=len(step.decoding))
        return _plain(step, "memory_pressure")


class BatchSizeGate:
    """``disable_by_batch_size`` (vLLM's name): at this many running sequences or more, no drafts."""

    name = "batch_size"

    def __init__(self, limit: int | None, metrics: "SpecMetrics"):
        self.limit = limit
        self.metrics = metrics

    def __call__(self, step: StepState) -> Decision | None:
        if self.limit is None or step.batch < self.limit:
            return None
        self.metrics.record_rejection("budget_zero", step.method)
        return _plain(step, "budget_zero", method=step.method)


class GoodputBudgetGate:
    """The goodput controller's budget for the method: a chain length, a tree budget, or a scored
    drafter's ceiling (its drafts are sized after drafting); 0 when drafting would not pay."""

    name = "goodput_budget"

    def __init__(self, controller: "GoodputController", metrics: "SpecMetrics"):
        self.controller = controller
        self.metrics = metrics

    def __call__(self, step: StepState) -> Decision:
        method, batch = step.method, step.batch
        proposer = step.proposers[method]
        if proposer.scores_drafts:
            budget = self.controller.choose_scored_budget(method, batch)
        elif proposer.builds_trees:
            budget = self.controller.choose_tree_budget(method, batch)
        else:
            budget = self.controller.choose(method, batch)
        budget = min(budget, proposer.max_budget())
        if not budget:
            self.metrics.record_rejection("budget_zero", method)
        return Decision.stop(StepPlan(method, budget, budget, batch, "" if budget else "budget_zero"))


# -- signals the gates share ----------------------------------------------------------------------


def remote_health(proposers: "Mapping[str, Proposer]") -> float:
    """The worst health of the loaded drafters (a remote one's share of answered pings; 1 otherwise)."""
    return min((p.health() for p in proposers.values()), default=1.0)


def match_length(proposers: "Mapping[str, Proposer]", decoding: "Sequence[EngineSequenceView]",
                 cap: int) -> int | None:
    """The longest copy the model-free drafter finds for any decoding sequence (suffix, which also
    searches earlier responses, else ngram); None without one."""
    for method in MATCHING_METHODS:
        proposer = proposers.get(method)
        if proposer is not None:
            best = 0
            for seq in decoding:
                best = max(best, proposer.match_length(seq, cap) or 0)
                if best >= cap:
                    break
            return best
    return None
