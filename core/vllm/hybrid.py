"""The hybrid inside vLLM: per step, a bandit picks a drafting method or no draft, from the goodput vLLM's
steps show (committed tokens over the step's wall time), with the load fallback in front of it.

What vLLM's hook lets us see: each ``propose`` call hands the tokens the previous step committed per row
(``sampled_token_ids``: accepted drafts + 1), and the time between two calls is that step's whole wall time
(forward, verification, scheduling, drafting).  So the arm chosen at one call is scored at the next, with
:class:`hyspec.policy.bandit.BanditPolicy` (the policy hyspec's own engine uses, classes by context length,
batch size and the longest copy suffix matching finds).  A step that admitted a request (a prefill) teaches
nothing: its time is the prefill's.

Load fallback: while the batch holds more than ``load_threshold`` of vLLM's ``max_num_seqs``, no drafts (the
verification rows compete with requests for the same compute); such steps are not learnt from either.
"""
from __future__ import annotations

from dataclasses import dataclass

from hyspec.policy.bandit import BanditPolicy, step_class
from hyspec.policy.signals import NONE


@dataclass(frozen=True)
class _Pending:
    klass: str
    arm: str
    started: float
    request_ids: frozenset[str]


class VllmHybrid:
    def __init__(self, arms: tuple[str, ...], max_num_seqs: int, load_threshold: float, explore_fraction: float):
        self.bandit = BanditPolicy([*arms, NONE], explore_fraction)
        self.max_num_seqs = max(1, max_num_seqs)
        self.load_threshold = load_threshold
        self._pending: _Pending | None = None
        self.load_fallback_steps = 0

    def observe(self, request_ids: list[str], sampled: list[int], now: float) -> None:
        """The step chosen at the previous call ended: ``sampled[i]`` tokens committed for ``request_ids[i]``
        (0: still prefilling).  Learnt only when every row decoded and no request joined."""
        pending, self._pending = self._pending, None
        if pending is None or not request_ids:
            return
        if any(n == 0 for n in sampled) or not set(request_ids) <= pending.request_ids:
            return
        self.bandit.observe(pending.klass, pending.arm, sum(sampled), now - pending.started)

    def choose(self, request_ids: list[str], mean_context: float, match_length: int | None, now: float) -> str:
        """This step's method (or ``NONE``) for a batch of ``request_ids`` decoding rows."""
        rows = len(request_ids)
        if rows > self.load_threshold * self.max_num_seqs:
            self.load_fallback_steps += 1
            return NONE
        klass = step_class(mean_context, rows, match_length)
        arm = self.bandit.choose(klass, rows)
        self._pending = _Pending(klass, arm, now, frozenset(request_ids))
        return arm

    def choices(self) -> dict[str, int]:
        """Steps each arm was chosen, over every class."""
        out: dict[str, int] = {}
        for (_, arm), n in self.bandit.snapshot().choices.items():
            out[arm] = out.get(arm, 0) + n
        return out
