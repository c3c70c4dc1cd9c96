"""The Proposer interface: how a drafting method plugs into the speculative step.

A proposer keeps its own draft state per sequence and catches up lazily: the
dispatcher may switch methods between steps, so a proposer can be asked to
draft for a sequence after many tokens were committed without it.  It learns
what was committed in two ways:

* the sequence's token history (``seq.token_ids``) -- enough for proposers
  conditioned on token ids only (ngram, draft_model);
* :meth:`Proposer.on_commit`, called after *every* step for every loaded
  proposer with the target hidden states of the tokens whose KV the target
  just kept -- what hidden-state drafters (EAGLE, MTP, DFlash, DSpark) buffer.

Drafts are returned as :class:`~hyspec.seam.tree.DraftTree` (a chain is a tree
with one child per node).  Greedy requests get deterministic drafts
(``draft_probs=None``); sampled requests get drafts drawn from q, the draft
distribution processed exactly like the target's (temperature, top-k, top-p,
min-p: ``SamplingTensors.process``), drawn with the request's own generator.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

import torch

from hyspec.ops.sampling import SamplingTensors
from hyspec.seam.tree import DraftTree
from hyspec.seam.views import SequenceView


@dataclass
class DraftRequest:
    seq: SequenceView
    budget: int  # draft nodes (excluding the root) this sequence may use this step; >= 1

    @property
    def greedy(self) -> bool:
        return self.seq.params.greedy


@dataclass
class CommittedHidden:
    """Target hidden states of tokens ``seq.token_ids[start : start + n]`` (their KV is now cached)."""

    start: int
    final: torch.Tensor  # [n, H] after the final norm (what lm_head sees)
    aux: dict[int, torch.Tensor]  # layer -> [n, H] residual stream after that layer


class Proposer(ABC):
    """A drafting method."""

    method: ClassVar[str]
    #: Target layers whose outputs the proposer conditions on (residual stream after each).
    aux_layers: tuple[int, ...] = ()
    #: True if on_commit must receive hidden states (False lets the engine skip the bookkeeping).
    needs_hidden: bool = False
    #: True for methods that build trees (the controller then picks a tree budget, not a length).
    builds_trees: bool = False
    #: True for methods whose trees carry NodeScores: they draft at their full budget and the step's
    #: verified size is chosen afterwards, draft by draft (draft_sizing.py)
    scores_drafts: bool = False
    #: True when propose drafts each request on its own (no batched model call), so asking for one request
    #: at a time costs nothing more: in a wave the engine then drafts row by row and stops once no row left
    #: can be on the wave's critical path (SpecDecoder._propose_wave)
    drafts_rows_independently: bool = False

    @abstractmethod
    def propose(self, requests: list[DraftRequest], sampling: SamplingTensors) -> list[DraftTree | None]:
        """One draft (or None: nothing worth proposing) per request, in order.

        None is not counted as a failure (ngram finding no match is normal); a
        proposer that returns None because of a fault records the cause itself
        (e.g. ``draft_timeout``).  Raising makes the whole step plain and is
        counted as ``draft_unavailable``.

        ``sampling`` has one row per request.  The tree's root is the
        sequence's last token (``seq.last_token``); it must have at most
        ``budget + 1`` nodes.
        """

    def max_budget(self) -> int:
        """Most draft nodes this proposer can produce per sequence and step."""
        return 64

    def match_length(self, seq: SequenceView, cap: int) -> int | None:
        """How many of ``seq``'s last tokens (at most ``cap``) this drafter finds earlier, followed by
        something it could draft: the hybrid's ``match_length`` signal.  None: this drafter does not
        copy (the model-based ones), so it has no such figure."""
        return None

    def on_commit(self, seq: SequenceView, hidden: CommittedHidden | None) -> None:
        """The target kept KV for more of ``seq``'s tokens (called after every step)."""

    def on_finish(self, seq: SequenceView) -> None:
        """Release everything held for ``seq``."""

    def on_preempt(self, seq: SequenceView) -> None:
        """The target dropped ``seq``'s KV; it will be re-prefilled.  Default: forget it."""
        self.on_finish(seq)

    def on_prefill(self, seqs: list[SequenceView]) -> None:
        """``seqs`` (speculating requests, maybe none) have a prompt chunk in this step, called every
        step before drafting: a proposer may start preparing them before their first draft (remote
        workers receive their history early)."""

    def observe_forward(self, seconds: float) -> None:
        """The step's target forward took ``seconds`` (remote drafters size their deadlines from it)."""

    def health(self) -> float:
        """How well the drafter's workers are doing, 0..1 (the dispatcher's ``remote_health``)."""
        return 1.0

    def take_faults(self) -> dict[str, int]:
        """Faults since the last call, by rejection cause (e.g. ``draft_timeout``), counted by the strategy."""
        return {}

    def forget_shared_history(self) -> None:
        """Forget what was learnt across requests (suffix decoding's cache of earlier responses).

        Benchmarks call it between timed passes, so that a pass cannot draft from a previous pass's
        answers to the very same prompts; serving never calls it."""

    def close(self) -> None:
        """Release shared resources (threads, remote workers)."""

