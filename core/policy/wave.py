"""Waves: batches whose requests were admitted together, where only the rows on the critical path may draft.

Why.  The goodput rule values an accepted draft token as a step saved for its row.  That holds when a
finished request's place is taken at once (a full batch, requests waiting).  A batch whose requests
were admitted together and that nothing joins (``LLM.generate`` over a list, a burst of clients, every
bench pass at batch > 1) lasts as long as its slowest row.  A row that finishes early only makes the
later steps one row cheaper, which is what each of its draft tokens costs to verify, so its drafts
cannot shorten the batch.  Measured inside vLLM (docs/results/2026-12-06/vllm-hybrid/): a HumanEval wave
of 32 sent 2258 draft tokens, 82 % accepted, and still took 49 steps.  In hyspec's own engine the rule's
effect on throughput was within the machine's noise (docs/results/2026-12-06/engine-batches/).

How.  :class:`WaveTracker` remembers the step each request first appeared in (hyspec's engine: queued;
inside vLLM: in the batch, its prompt prefilled over a few steps); a batch is a wave while every request
in it first appeared within ``WAVE_STEPS`` steps of the first and none has appeared since.  In a wave,
:func:`critical_rows` keeps the rows whose drafts can shorten it: within a draft's length of the most tokens left, and with more left than any row that
has nothing to draft (that row advances one token a step, so the wave lasts at least that long).
Lossless whatever is kept: a row left out decodes plainly.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping

#: a wave's requests may first appear over this many steps (their prompts prefilled in chunks)
WAVE_STEPS = 4


class WaveTracker:
    """The step each request now in the batch first appeared in."""

    def __init__(self, within_steps: int = WAVE_STEPS) -> None:
        self.within_steps = within_steps
        self.steps = 0  # calls of follow
        self.first_seen: dict[str, int] = {}

    def follow(self, request_ids: Iterable[str]) -> None:
        """One step's batch: requests new to it are stamped, those gone are forgotten."""
        self.steps += 1
        present = set(request_ids)
        for rid in present:
            self.first_seen.setdefault(rid, self.steps)
        for rid in [r for r in self.first_seen if r not in present]:
            del self.first_seen[rid]

    def admitted_together(self) -> bool:
        """Whether every request now in the batch first appeared within ``within_steps`` steps of the first
        and none has appeared since."""
        seen = self.first_seen.values()
        return bool(seen) and max(seen) - min(seen) < self.within_steps


def critical_rows(remaining: Mapping[str, int], draft_lengths: Mapping[str, int]) -> set[str]:
    """The drafting rows of a wave whose drafts can shorten it.

    ``remaining``: every decoding row's tokens left before its ``max_tokens`` (rows without a draft
    included); ``draft_lengths``: each drafting row's longest draft (0 or absent: nothing to draft)."""
    if not remaining:
        return set()
    horizon = max(remaining.values())
    undrafted = max((left for rid, left in remaining.items() if draft_lengths.get(rid, 0) <= 0), default=-1)
    slack = max(draft_lengths.values(), default=0)
    return {rid for rid, n in draft_lengths.items()
            if n > 0 and remaining.get(rid, horizon) + slack >= horizon and remaining.get(rid, horizon) > undrafted}
