"""``hyspec bench --ceiling K``: the most any drafter could reach here, measured with an oracle.

Why: a speculative method's speed-up mixes two things -- how often its drafts are accepted and what a
verified row costs on this machine.  The second decides whether speculation can pay at all: on a
2-core CPU at batch 8 plain decoding is already compute-bound and a perfect drafter gains ~1.15x
(docs/results/2026-12-05/speculation-ceiling/), on an accelerator at batch 1 it gains ~K+1.  The
oracle answers that question directly: it drafts, K tokens a step, exactly what plain decoding
committed for the same request in this run (greedy only), so every draft is accepted and drafting costs
a list slice.  Its speed is the ceiling of every method at that K; its row is named ``ceiling_kK`` and is
never a candidate for "best method" in the goals (it needs the answer in advance).

The oracle is a registered method (hyspec.spec.registry) only while its engine starts, and it drafts with
the goodput controller off (every step verifies K tokens, fewer at a request's end).  It is still
verified by the target like any method: its outputs are judged against plain decoding's, and a
batch-variant near-tie that makes plain decoding's answer differ from the engine's own shows up as a
rejected draft, not as a wrong token.
"""
from __future__ import annotations

import contextlib
from typing import Any, Iterator, Sequence

from hyspec.errors import ConfigError
from hyspec.spec import registry
from hyspec.spec.config import MAX_SPECULATIVE_TOKENS

#: the row name prefix: ``ceiling_k7``
PREFIX = "ceiling_k"
#: the method name the oracle is registered under while its engine starts
ORACLE = "oracle"


def row_name(k: int) -> str:
    return f"{PREFIX}{k}"


def is_ceiling(method: str) -> bool:
    return method.startswith(PREFIX)


def check_ks(ks: Sequence[int]) -> tuple[int, ...]:
    """The --ceiling values, each a draft length the engine accepts; ConfigError naming a bad one."""
    for k in ks:
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_SPECULATIVE_TOKENS:
            raise ConfigError("--ceiling", f"draft lengths must be integers in 1..{MAX_SPECULATIVE_TOKENS}, got {k!r}")
    return tuple(sorted(set(ks)))


class Answers:
    """Plain decoding's outputs by prompt, swapped per workload (one oracle engine serves every batch size)."""

    def __init__(self) -> None:
        self._by_prompt: dict[tuple[int, ...], list[int]] = {}

    def set(self, prompts: Sequence[Sequence[int]], outputs: Sequence[Sequence[int]]) -> None:
        self._by_prompt = {tuple(p): list(o) for p, o in zip(prompts, outputs)}

    def after(self, prompt: Sequence[int], done: int, k: int) -> list[int]:
        """Up to ``k`` tokens of the answer to ``prompt`` after its first ``done``; [] for an unknown prompt."""
        answer = self._by_prompt.get(tuple(prompt))
        return [] if answer is None else answer[done: done + k]


def _build_oracle(answers: Answers):
    # the seam brings torch: at the top, `hyspec --help` (whose bench command imports hyspec.bench.settings ->
    # this module) would import torch; measured with `import hyspec.cli.main; build_parser()`
    from hyspec.seam.proposer import DraftRequest, Proposer
    from hyspec.seam.tree import DraftTree

    class OracleProposer(Proposer):
        method = ORACLE

        def __init__(self, k: int, vocab_size: int):
            self.k, self.vocab_size = k, vocab_size

        def max_budget(self) -> int:
            return self.k

        def propose(self, requests: list[DraftRequest], sampling) -> list[DraftTree | None]:
            out: list[DraftTree | None] = []
            for req in requests:
                seq = req.seq
                follow = answers.after(seq.prompt_token_ids, seq.num_output_tokens, min(req.budget, self.k))
                out.append(DraftTree.chain(seq.last_token, follow, vocab_size=self.vocab_size) if follow else None)
            return out

    def factory(target, spec, weights) -> OracleProposer:  # weights: None, the oracle has none
        return OracleProposer(spec.num_speculative_tokens, target.vocab_size)

    return factory


@contextlib.contextmanager
def oracle_registered(answers: Answers) -> Iterator[None]:
    """The ``oracle`` method in the registry for the duration (an engine builds its proposer on start)."""
    registry.register(registry.MethodInfo(ORACLE, "plain decoding's own answers (hyspec bench --ceiling)",
                                          _build_oracle(answers), weights=False, chain_only=True))
    try:
        yield
    finally:
        registry.unregister(ORACLE)


def speculative_config(k: int) -> dict[str, Any]:
    """The oracle's config: K tokens every step, the goodput controller off (it would size drafts from the
    oracle's early steps; the ceiling wants every step at K)."""
    return {"method": ORACLE, "num_speculative_tokens": k,
            "controller": {"enabled": False, "profile_at_startup": False}}


__all__ = ["Answers", "ORACLE", "PREFIX", "check_ks", "is_ceiling", "oracle_registered", "row_name",
           "speculative_config"]
