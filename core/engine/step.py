"""The records one engine step passes between its stages.

``LLMEngine.step`` runs schedule -> draft -> run -> accept -> emit.  The run
stage packs every scheduled sequence into one target forward; what it hands on
is a :class:`TargetRun`: the feeds in forward order, what each row is, the
model's output and how long the forward took.  The speculation strategy reads
it to verify drafts and to learn (hidden states, step cost), without any other
channel to the engine.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from hyspec.engine.model_runner import Feed, ForwardResult
from hyspec.engine.sequence import Sequence


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
    seq: Sequence


@dataclass(frozen=True)
class TargetRun:
    """One packed target forward: ``feeds[i]`` is ``rows[i]``'s share of ``result``."""

    feeds: list[Feed]
    rows: list[StepRow]
    result: ForwardResult  # logits per feed, final and auxiliary hidden states
    seconds: float  # wall time of the forward (the verify cost of a speculative step)
    #: samples of the same prompt that continue from a PREFILL row's KV (leader id -> samples);
    #: they sample their first token from that row and receive its hidden states
    forks: dict[str, list[Sequence]] = field(default_factory=dict)

    def indices(self, kind: RowKind) -> list[int]:
        return [i for i, row in enumerate(self.rows) if row.kind is kind]
