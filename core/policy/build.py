"""One engine's speculation policy, built from its speculative config: the chain of gates
(:mod:`hyspec.policy.chain`) and the mechanisms behind them, which learn after each step.

``SpecDecoder`` asks :class:`Policy` three things: the step's plan (:meth:`Policy.plan`), a request's
canary arm (:meth:`Policy.arm`), and to learn from a finished step (:meth:`Policy.observe_step`).
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Mapping, Sequence

from hyspec.policy.bandit import BanditPolicy
from hyspec.policy.canary import SPEC, Canary
from hyspec.policy.chain import (
    BatchSizeGate,
    ConfiguredMethodGate,
    DispatcherGate,
    Gate,
    GoodputBudgetGate,
    MemoryPressureGate,
    NothingToDraftGate,
    PolicyChain,
    ReleasedMethodGate,
    StepState,
    TTFTGate,
)
from hyspec.policy.controller import GoodputController
from hyspec.policy.dispatcher import HybridDispatcher
from hyspec.policy.profiling import profile_cost_model
from hyspec.policy.residency import DrafterResidency
from hyspec.policy.signals import NONE
from hyspec.policy.slo import TTFTGuard
from hyspec.seam.step import StepPlan
from hyspec.spec.config import SpeculativeConfig

if TYPE_CHECKING:
    from hyspec.seam.proposer import Proposer
    from hyspec.seam.target import TargetContext
    from hyspec.spec.metrics import SpecMetrics

log = logging.getLogger(__name__)


class Policy:
    """The gates in order, and the stateful mechanisms some of them consult."""

    def __init__(self, chain: PolicyChain, controller: GoodputController, residency: DrafterResidency,
                 slo: TTFTGuard, dispatcher: HybridDispatcher | None = None, canary: Canary | None = None):
        self.chain = chain
        self.controller = controller  # the budget; also sizes scored drafts and learns from every verified step
        self.residency = residency
        self.slo = slo
        self.dispatcher = dispatcher  # the hybrid's method choice; None for a single method
        self.canary = canary  # None: every request speculates

    def plan(self, step: StepState) -> StepPlan:
        plan = self.chain.plan(step)
        if self.dispatcher is not None and not plan.budget and plan.method != NONE:
            self.dispatcher.vetoed()  # the dispatcher chose a method that a later gate kept from drafting
        return plan

    def arm(self, request_id: str) -> str:
        """The request's canary arm: "spec", or "control" (it always decodes plainly)."""
        return SPEC if self.canary is None else self.canary.arm(request_id)

    def request_finished(self, ttft_seconds: float | None) -> None:
        """A request ended: its time to first token joins the TTFT guard's window."""
        self.slo.observe(ttft_seconds)

    def observe_step(self, committed_tokens: int, seconds: float) -> None:
        """A decode step committed ``committed_tokens`` over ``seconds`` of wall time, plan to commit: the
        hybrid's bandit learns."""
        if self.dispatcher is not None:
            self.dispatcher.observe_step(committed_tokens, seconds)

    def close(self) -> None:
        if self.dispatcher is not None:
            self.dispatcher.close()


def build_policy(config: SpeculativeConfig, target: "TargetContext", proposers: "Mapping[str, Proposer]",
                 caps: Sequence[tuple[str, int]], metrics: "SpecMetrics") -> Policy:
    """The policy for ``config``: ``proposers`` are the loaded drafters, ``caps`` (method,
    ``num_speculative_tokens``) pairs (a bare hybrid's methods are not in ``config.hybrid.methods``)."""
    controller = _controller(config, target)
    for method, num_tokens in caps:
        controller.cap(method, num_tokens)
    dispatcher = _dispatcher(config, target, proposers) if config.method == "hybrid" else None
    canary = Canary(config.hybrid.speculative_fraction) if config.hybrid.speculative_fraction < 1.0 else None
    residency = DrafterResidency(config.memory_pressure, metrics, remote=config.draft_placement == "remote")
    slo = TTFTGuard(config.slo, metrics.ops)
    method_gate: Gate = (ConfiguredMethodGate(config.method) if dispatcher is None
                         else DispatcherGate(dispatcher, controller, target.pool))
    chain = PolicyChain((
        MemoryPressureGate(residency, target.pool),
        TTFTGate(slo, metrics, config.method),
        method_gate,
        NothingToDraftGate(),
        ReleasedMethodGate(metrics),
        BatchSizeGate(config.disable_by_batch_size, metrics),
        GoodputBudgetGate(controller, metrics),
    ))
    return Policy(chain, controller, residency, slo, dispatcher, canary)


def _controller(config: SpeculativeConfig, target: "TargetContext") -> GoodputController:
    if config.controller.enabled and config.controller.profile_at_startup:
        return GoodputController(config, profile_cost_model(target))
    return GoodputController(config)


def _dispatcher(config: SpeculativeConfig, target: "TargetContext",
                proposers: "Mapping[str, Proposer]") -> HybridDispatcher:
    h = config.hybrid
    bandit = None
    if h.policy == "bandit":
        bandit = BanditPolicy([*proposers, NONE], h.bandit_explore_fraction, h.bandit_warmup, h.bandit_discount,
                              plain_margin=h.bandit_plain_margin, max_backoff=h.bandit_max_backoff)
    return HybridDispatcher(h.rules_path, list(proposers), load_threshold=h.load_threshold,
                            load_resume_threshold=h.load_resume_threshold, load_signal=h.load_signal,
                            max_batch_size=target.max_num_seqs, bandit=bandit)
