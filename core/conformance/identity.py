"""Greedy identity by teacher forcing: every position of a method's output judged on the target's own logits.

Comparing token lists stops at the first difference, so most of a sequence
that diverged once is never compared.  Here the target's logits are computed
the plain way (a prefill forward on the engine's own backend, dtype and
weights) on the method's own prefix, for every output position; a position
where the method's token is not the argmax is a flip, judged by its logit gap
against the measured near-tie rule (``hyspec.numerics.NearTieRule``), and the
comparison goes on from the method's prefix.

The rule is measured on the same engine: plain decoding's outputs are
re-computed in two batch compositions that verification really mixes -- each
sequence alone in one forward, and every sequence together in chunks of the
verification width -- and the largest top-two logit difference between them
sets the bound.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import torch

from hyspec.kv.sequence_kv import SequenceKV
from hyspec.numerics import IdentityReport, NearTieRule, judge_teacher_forced, rounding_deltas
from hyspec.seam.forward import ALL_LOGITS, Feed

if TYPE_CHECKING:
    from hyspec.engine.engine import LLMEngine


def reference_logits(engine: "LLMEngine", prompts: Sequence[Sequence[int]], outputs: Sequence[Sequence[int]],
                     chunk: int | None = None) -> list[torch.Tensor]:
    """Per sequence ``[len(output), V]``: the target's next-token logits before each output token.

    ``chunk=None``: each sequence alone, prompt and output in one prefill forward.  ``chunk=n``:
    every sequence in one batch, ``n`` tokens of each per forward (the shape of verifying n - 1
    drafts).  Uses the engine's own KV pool and releases every page it took.
    """
    seqs = [list(p) + list(o) for p, o in zip(prompts, outputs)]
    rows: list[list[torch.Tensor]] = [[] for _ in seqs]
    if chunk is None:  # one sequence's pages at a time
        for i, seq in enumerate(seqs):
            kv = SequenceKV(engine.pool, engine.layout)
            try:
                kv.reserve(len(seq))
                rows[i].append(engine.runner.run([Feed(kv, seq[:-1], 0, logits=ALL_LOGITS)]).logits)
            finally:
                kv.release()
        return [torch.cat(r).float().cpu()[len(p) - 1:] for r, p in zip(rows, prompts)]
    kvs = [SequenceKV(engine.pool, engine.layout) for _ in seqs]  # together: every sequence's pages at once
    try:
        for kv, seq in zip(kvs, seqs):
            kv.reserve(len(seq))
        start = 0
        while True:
            live = [i for i, seq in enumerate(seqs) if start < len(seq) - 1]
            if not live:
                break
            feeds = [Feed(kvs[i], seqs[i][start:min(start + chunk, len(seqs[i]) - 1)], start, logits=ALL_LOGITS)
                     for i in live]
            result = engine.runner.run(feeds)
            for f, i in enumerate(live):
                rows[i].append(result.feed_logits(f))
            start += chunk
    finally:
        for kv in kvs:
            kv.release()
    return [torch.cat(r).float().cpu()[len(p) - 1:] for r, p in zip(rows, prompts)]


def measure_rule(engine: "LLMEngine", prompts: Sequence[Sequence[int]], outputs: Sequence[Sequence[int]],
                 chunk: int) -> NearTieRule:
    """The near-tie rule from plain decoding's own outputs in two batch compositions (module doc)."""
    alone = reference_logits(engine, prompts, outputs)
    together = reference_logits(engine, prompts, outputs, chunk=chunk)
    deltas = [d for a, b in zip(alone, together) for d in rounding_deltas(a, b)]
    top = max((float(a.max()) for a in alone if a.numel()), default=0.0)
    return NearTieRule.from_measurement(deltas, engine.dtype, top)


def judge_outputs(engine: "LLMEngine", prompts: Sequence[Sequence[int]], outputs: Sequence[Sequence[int]],
                  rule: NearTieRule, expected_lengths: Sequence[int] | None = None) -> IdentityReport:
    """Teacher-forced identity of ``outputs`` (one per prompt) on ``engine``'s target."""
    report = IdentityReport()
    references = reference_logits(engine, prompts, outputs)
    for i, (ref, out) in enumerate(zip(references, outputs)):
        report = report.merge(judge_teacher_forced(ref, out, rule, sequence=i))
        if expected_lengths is not None and len(out) != expected_lengths[i]:
            report.length_mismatches.append(f"sequence {i} has {len(out)} tokens, plain decoding {expected_lengths[i]}")
    return report


def excess_near_ties(method: IdentityReport, plain: IdentityReport) -> float:
    """How far the method's near-tie count lies above plain-vs-plain's rate, in its noise (>3: too many).

    The plain rate is that of plain decoding at another batch composition against the same
    reference; the method's count at that rate is binomial, so its excess is measured in standard
    deviations, with one flip of slack so a zero plain rate does not make a single tie fatal.
    """
    n = method.positions
    expected = plain.near_tie_rate * n
    sd = max(1.0, (expected * (1 - plain.near_tie_rate)) ** 0.5)
    return (len(method.near_ties) - expected - 1) / sd


__all__ = ["excess_near_ties", "judge_outputs", "measure_rule", "reference_logits"]
