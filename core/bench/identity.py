"""Were a configuration's greedy outputs token-identical to plain decoding?

hyspec's own methods are judged by teacher forcing (``TeacherForcedJudge``):
every output position against the plain engine's logits for the method's own
prefix, under the near-tie rule measured on that engine between two plain
batch compositions (``hyspec.conformance.identity``), so a flip is judged
where it happens and comparison goes on after it.  Another engine's outputs
(transformers) are compared by first divergence under the dtype's blanket
bound (``hyspec.numerics.classify_divergence``): the rounding between two
engines' kernels is not what batch compositions measure.  A mismatch is
reported loudly and turns into a non-zero exit status.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
from hyspec.conformance.identity import measure_rule, judge_outputs
from hyspec.model.loader import load_model
from hyspec.numerics import classify_divergence, first_divergence

IDENTICAL, NEAR_TIE, MISMATCH, NOT_APPLICABLE = "identical", "near_tie", "mismatch", "not_applicable"
MAX_DETAILS = 5


@dataclass
class IdentityVerdict:
    """``status``: identical | near_tie (allowed, reported) | mismatch | not_applicable (sampling)."""

    status: str
    sequences: int = 0
    near_ties: int = 0
    mismatches: int = 0
    details: list[str] = field(default_factory=list)
    positions: int | None = None  # teacher-forced: output positions judged (None: first-divergence comparison)

    @property
    def ok(self) -> bool:
        return self.status != MISMATCH

    def to_dict(self) -> dict[str, Any]:
        return {"status": self.status, "token_identical": self.status == IDENTICAL if self.status != NOT_APPLICABLE
                else None, "sequences": self.sequences, "near_ties": self.near_ties, "mismatches": self.mismatches,
                "positions": self.positions, "details": list(self.details)}


class ReferenceLogits:
    """The target's next-token logits after a prefix; the model loads on first use (only at divergences)."""

    def __init__(self, model_path: Path, dtype: torch.dtype, backend: Any = None, quantization: str | None = None):
        self.model_path, self.dtype = model_path, dtype
        self.backend, self.quantization = backend, quantization  # with a backend: its kernels, as the engine's
        self._model = None

    def __call__(self, prefix: Sequence[int]) -> torch.Tensor:  # -> [V]
        if self._model is None:

            if self.backend is None:
                self._model = load_model(self.model_path, dtype=self.dtype)
            else:
                self._model = self.backend.optimize_model(load_model(
                    self.model_path, dtype=self.dtype, ops=self.backend.ops, device=self.backend.device,
                    quantization=self.quantization, backend=self.backend))
        model = self._model
        with torch.inference_mode():
            ids = torch.tensor([list(prefix)], device=model.embed_tokens.weight.device)  # the backend's device
            hidden = model.forward_dense(ids).hidden[0, -1:]
            return model.compute_logits(hidden)[0].float()


class TeacherForcedJudge:
    """Judges hyspec outputs on a plain engine kept for the purpose (its pages are released after each use)."""

    def __init__(self, llm: Any, prompts: Sequence[Sequence[int]], plain_outputs: Sequence[Sequence[int]],
                 chunk: int):

        self.llm = llm
        self.rule = measure_rule(llm.engine, prompts, plain_outputs, chunk=chunk)

    def __call__(self, prompts: Sequence[Sequence[int]], expected: Sequence[Sequence[int]],
                 actual: Sequence[Sequence[int]]) -> IdentityVerdict:

        if not len(prompts) == len(expected) == len(actual):
            raise ValueError(f"{len(prompts)} prompts, {len(expected)} expected and {len(actual)} actual outputs")
        report = judge_outputs(self.llm.engine, prompts, actual, self.rule, [len(e) for e in expected])
        verdict = IdentityVerdict(IDENTICAL, sequences=len(actual), near_ties=len(report.near_ties),
                                  mismatches=len(report.mismatches) + len(report.length_mismatches))
        verdict.positions = report.positions
        verdict.details = [report.describe(), self.rule.describe()]
        verdict.status = MISMATCH if verdict.mismatches else NEAR_TIE if verdict.near_ties else IDENTICAL
        return verdict


class LazyJudge:
    """A :class:`TeacherForcedJudge` built the first time an output differs from plain decoding's.

    An output equal to plain decoding's tokens is identical by definition; teacher forcing matters where they
    differ (was the flip a near-tie?).  Building the judge costs a plain engine and a pass that measures the
    near-tie rule, so a run whose methods all match plain decoding (the usual case, and ``--demo``) skips it.
    """

    def __init__(self, build: Callable[[], TeacherForcedJudge]):
        self._build = build
        self._judge: TeacherForcedJudge | None = None

    def __call__(self, prompts: Sequence[Sequence[int]], expected: Sequence[Sequence[int]],
                 actual: Sequence[Sequence[int]]) -> IdentityVerdict:
        if len(prompts) == len(expected) == len(actual) and all(list(a) == list(e) for a, e in zip(actual, expected)):
            return IdentityVerdict(IDENTICAL, sequences=len(actual))
        if self._judge is None:
            self._judge = self._build()
        return self._judge(prompts, expected, actual)


def check_identity(
    prompts: Sequence[Sequence[int]],
    expected: Sequence[Sequence[int]],
    actual: Sequence[Sequence[int]],
    reference_logits: Callable[[Sequence[int]], torch.Tensor],
    dtype: torch.dtype,
) -> IdentityVerdict:
    """Compare every sequence of ``actual`` with ``expected`` (plain decoding) for the same prompts."""

    if not len(prompts) == len(expected) == len(actual):
        raise ValueError(f"check_identity: {len(prompts)} prompts, {len(expected)} expected and "
                         f"{len(actual)} actual outputs")
    verdict = IdentityVerdict(IDENTICAL, sequences=len(actual))
    for number, (prompt, exp, act) in enumerate(zip(prompts, expected, actual)):
        index = first_divergence(exp, act)
        if index is None:
            continue
        logits = reference_logits(list(prompt) + list(exp[:index])) if index < min(len(exp), len(act)) else None
        result = classify_divergence(exp, act, logits, dtype)
        if result.kind == MISMATCH:
            verdict.mismatches += 1
        else:
            verdict.near_ties += 1
        if len(verdict.details) < MAX_DETAILS:
            verdict.details.append(f"sequence {number}: {result.describe()}")
    verdict.status = MISMATCH if verdict.mismatches else NEAR_TIE if verdict.near_ties else IDENTICAL
    return verdict
