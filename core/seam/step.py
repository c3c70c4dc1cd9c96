"""The records one engine step passes between its stages.

``LLMEngine.step`` runs schedule -> draft -> run -> accept -> emit, asking the
speculation strategy (``hyspec.spec.strategy.Speculation``) at fixed points::

    plan   = spec.plan(scheduler)          # schedule: a StepPlan (method, draft budget -> KV lookahead)
    drafts = spec.draft(plan, scheduled)   # draft: Drafts, a DraftTree per decoding sequence, or none
    run    = <one target forward over every row, trees included>: a TargetRun
    accepted = spec.accept(run, drafts)    # accept: Accepted, what verification kept
    spec.observe(run, accepted)            # learn: hidden states to drafters, step cost, metrics

The run stage packs every scheduled sequence into one target forward; what it
hands on is a :class:`TargetRun`: the feeds in forward order, what each row
is, the model's output and how long the forward took.  The strategy reads it
to verify drafts and to learn, without any other channel to the engine.
Every record here is a typed value; nothing is set on the strategy for a
later call to read.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from hyspec.seam.forward import Feed, ForwardResult
from hyspec.seam.tree import DraftTree
from hyspec.seam.views import EngineSequenceView

NONE = "none"


@dataclass(frozen=True)
class StepPlan:
    method: str  # a loaded method, or "none"
    budget: int  # draft nodes per sequence (chain length for chain methods); 0 = plain step
    lookahead: int  # KV entries each decode reserves beyond its root
    batch_size: int
    reason: str = ""  # why the step is plain, for metrics ("budget_zero", "dispatcher", "load")
    #: the batch is a wave (hyspec.policy.wave): only rows on its critical path may draft
    wave: bool = False
    #: perf_counter() when planning began: the step's wall time, which the policy learns from, starts here
    started: float = field(default=0.0, compare=False)


PLAIN = StepPlan(NONE, 0, 0, 1)


@dataclass(frozen=True)
class Drafts:
    """The step's drafts: one tree per sequence that speculates (request id -> tree).

    The engine turns each tree into its sequence's verification feed (``hyspec.engine.engine.tree_feed``)."""

    plan: StepPlan
    trees: dict[str, DraftTree] = field(default_factory=dict)
    seconds: float = 0.0  # drafting wall time

    def __bool__(self) -> bool:
        return bool(self.trees)


@dataclass(frozen=True)
class Accepted:
    """What verification kept: tokens to emit, and the tree rows whose KV stayed (root first)."""

    tokens: dict[str, list[int]] = field(default_factory=dict)
    kept_rows: dict[str, list[int]] = field(default_factory=dict)
    plan: StepPlan = PLAIN  # the step's plan (its start time included), for what is learnt after it
    draft_seconds: float = 0.0  # the step's drafting wall time (Drafts.seconds)


class RowKind(Enum):
    """What one feed of the step's forward is."""

    DECODE = "decode"  # the last token of a decoding sequence, no draft: one sampled token
    TREE = "tree"  # the last token plus a draft tree: verified
    PREFILL = "prefill"  # the final chunk of a prompt: its last row is sampled
    CHUNK = "chunk"  # a non-final prompt chunk: KV only, no token yet

    @property
    def samples_plainly(self) -> bool:
        return self in (RowKind.DECODE, RowKind.PREFILL)

    @property
    def decodes(self) -> bool:
        return self in (RowKind.DECODE, RowKind.TREE)


@dataclass(frozen=True)
class StepRow:
    kind: RowKind
    seq: EngineSequenceView


@dataclass(frozen=True)
class TargetRun:
    """One packed target forward: ``feeds[i]`` is ``rows[i]``'s share of ``result``."""

    feeds: list[Feed]
    rows: list[StepRow]
    result: ForwardResult  # logits per feed, final and auxiliary hidden states
    seconds: float  # wall time of the forward (the verify cost of a speculative step)
    #: samples of the same prompt that continue from a PREFILL row's KV (leader id -> samples);
    #: they sample their first token from that row and receive its hidden states
    forks: dict[str, list[EngineSequenceView]] = field(default_factory=dict)

    def indices(self, kind: RowKind) -> list[int]:
        return [i for i, row in enumerate(self.rows) if row.kind is kind]
