"""Per-request logits processors: what a request asks done to the target's logits.

Penalties, ``logit_bias``, ``min_tokens``, ``bad_words``, ``allowed_token_ids`` and
grammars (structured outputs) all change the target's distribution at a position as a
function of the tokens before it.  Under speculation one verification step scores many
positions at once, each after a different prefix (the committed output followed by the
draft tokens on its root-to-node path), so a processor is asked for every verified row
with that row's own path: the law the verifier compares against is then exactly the one
plain decoding would have sampled from at that position.

Drafters may ignore processors; verification decides.  A processor that forbids a
draft token outright (a grammar) also says so before the target runs
(:meth:`TokenProcessor.allowed_prefix`), so the drafts it would reject anyway are cut.

Lives in the seam: the engine builds processors from a request, the verifier (spec)
applies them, and neither imports the other.
"""
from __future__ import annotations

from typing import Protocol, Sequence, runtime_checkable

import torch


@runtime_checkable
class TokenProcessor(Protocol):
    """One request's logits processor; stateful, advanced only by :meth:`commit`.

    The state it keeps is that of the committed output (the prompt is given at
    construction).  ``process`` and ``allowed_prefix`` never change that state: they look
    ahead along draft paths and must leave the processor as they found it (a grammar
    matcher rolls back).
    """

    def process(self, paths: Sequence[Sequence[int]], logits: torch.Tensor) -> None:
        """Change ``logits [P, V]`` in place: row ``j`` is the target's raw logits after the
        committed output followed by ``paths[j]`` (``paths[j] == []`` for the position right
        after the committed output)."""
        ...

    def allowed_prefix(self, path: Sequence[int]) -> int:
        """How many leading tokens of ``path`` (drafts after the committed output) could be
        sampled at all; processors that never forbid a token return ``len(path)``."""
        ...

    def commit(self, tokens: Sequence[int]) -> None:
        """The tokens this step emitted for the request, in order."""
        ...


def apply_processors(processors: Sequence[TokenProcessor], paths: Sequence[Sequence[int]],
                     logits: torch.Tensor) -> None:
    """Run a request's processors in order on its rows (``logits [P, V]``, in place)."""
    for processor in processors:
        processor.process(paths, logits)


def allowed_prefix(processors: Sequence[TokenProcessor], path: Sequence[int]) -> int:
    """The longest leading part of ``path`` that every processor allows."""
    n = len(path)
    for processor in processors:
        n = min(n, processor.allowed_prefix(path[:n]))
    return n
