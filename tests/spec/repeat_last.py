"""A test-only drafting method, ``repeat_last``: the whole "package" of a method in one module.

It drafts the sequence's last token repeated (no weights, one chain per step).
``tests/spec/test_method_registry.py`` registers it with one ``MethodInfo``
whose factory is :func:`build`, the way a real method's entry names
``hyspec.drafters.<method>.build``.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from hyspec.seam.proposer import DraftRequest, Proposer
from hyspec.seam.tree import DraftTree

if TYPE_CHECKING:
    from hyspec.ops.sampling import SamplingTensors
    from hyspec.seam.target import TargetContext
    from hyspec.drafters.methods import MethodSpec

NAME = "repeat_last"


class RepeatLastProposer(Proposer):
    method = NAME

    def __init__(self, max_tokens: int, vocab_size: int):
        self.max_tokens = max_tokens
        self.vocab_size = vocab_size
        self.built_for: list[str] = []  # the method names it was built for (the test checks the spec)

    def max_budget(self) -> int:
        return self.max_tokens

    def propose(self, requests: list[DraftRequest], sampling: "SamplingTensors") -> list[DraftTree | None]:
        return [DraftTree.chain(req.seq.last_token, [req.seq.last_token] * min(req.budget, self.max_tokens),
                                vocab_size=self.vocab_size) for req in requests]


def build(target: "TargetContext", spec: "MethodSpec", weights: None) -> RepeatLastProposer:
    """The factory the table entry names (no weights: ``weights`` is None)."""
    proposer = RepeatLastProposer(spec.num_speculative_tokens, target.vocab_size)
    proposer.built_for.append(spec.method)
    return proposer
