"""Whether drafting at all pays for a scored method: its host time against the time its drafts are expected to save.

Why.  A scored drafter (suffix decoding) drafts every step at its full budget, and the sizer decides afterwards
which nodes are worth verifying (draft_sizing.py).  The sizer weighs verification against plain decoding, but
never the drafting itself, which is spent before it decides.  Where matches rarely continue (chat) it keeps a
draft on few steps, each saving little, while every step pays for the drafting: on a 2-core Zen 4 VM at batch 1,
~0.3 ms of a ~7 ms step, and suffix ran 0.94-0.95x plain decoding (docs/results/2026-12-07/spec-pays/).

How.  Each step that drafts reports its drafting seconds (proposing and sizing: the cost) and the time the
sizer's choice is expected to save (the value: the expected committed tokens at plain decoding's seconds per
token, less the speculative step's predicted seconds; 0 when it kept nothing or probed).  Both are EWMAs over
drafting steps.  While the value falls short of the cost, the method drafts only one step in ``PROBE_EVERY``,
which keeps both measured at a sixteenth of the cost; once the value covers the cost it drafts every step again.

Lossless: a step that does not draft decodes plainly.
"""
from __future__ import annotations

#: while drafting does not pay, draft one step in this many (to go on measuring it)
PROBE_EVERY = 16
#: drafting steps measured before drafting may be judged not to pay
MIN_SAMPLES = 16
#: EWMA weight of one drafting step
ALPHA = 0.05


class DraftingValue:
    """One scored method's drafting cost and expected value per drafting step."""

    def __init__(self) -> None:
        self.cost = 0.0  # EWMA seconds a drafting step spends drafting
        self.value = 0.0  # EWMA seconds a drafting step's drafts are expected to save
        self.samples = 0
        self.skipped = 0  # steps not drafted because drafting did not pay
        self._since_draft = 0
        self._pending_value = 0.0

    def pays(self) -> bool:
        """Whether to draft this step."""
        return self.samples < MIN_SAMPLES or self.value >= self.cost

    def should_draft(self) -> bool:
        """``pays``, or this is the step in ``PROBE_EVERY`` that measures it again."""
        if self.pays() or self._since_draft + 1 >= PROBE_EVERY:
            self._since_draft = 0
            return True
        self._since_draft += 1
        self.skipped += 1
        return False

    def expect(self, seconds_saved: float) -> None:
        """The sizer's choice this step is expected to save ``seconds_saved`` (called before ``drafted``)."""
        self._pending_value = max(0.0, seconds_saved)

    def drafted(self, seconds: float) -> None:
        """This step drafted for ``seconds`` (its expected value, if any, given by ``expect``)."""
        value, self._pending_value = self._pending_value, 0.0
        if self.samples == 0:
            self.cost, self.value = seconds, value
        else:
            self.cost += ALPHA * (seconds - self.cost)
            self.value += ALPHA * (value - self.value)
        self.samples += 1
