"""Near-tie tolerances: the one place that says when an argmax flip is rounding, not a bug.

docs/architecture.md §4: verifying several tokens in one batched forward can round
differently from one-token steps (other reduction orders and tilings in the
matmuls and attention), so greedy speculative output may legitimately differ
from plain decoding where, and only where, the target's top two logits tie
within rounding.  Tests demand identical token ids and allow a divergence only
at such a measured near-tie, which they report (``classify_divergence``).

How the tolerances are chosen.  Rounding differences in a logit scale with the
logit's magnitude (every op has a relative error of about the dtype's machine
epsilon, and the final lm_head dot product inherits the relative error of the
hidden state it reads), plus an absolute part for logits near 0.  So a token
pair is a near-tie when their logits differ by at most
``absolute + relative * |top logit|``, with:

* float32 (eps 1.2e-7): ``relative = absolute = 1e-5``, about 80 ulps.  Dozens
  of layers each re-rounding reductions over thousands of terms in another
  order amplify single-op error by one to two orders of magnitude; 1e-5 covers
  that with margin and still flags any real bug (those move logits by O(1)).
* bfloat16 (eps 7.8e-3, 8 significant bits): ``relative = absolute = 2**-6``,
  two ulps of the logit itself.  Logits are usually stored in bf16, so two
  computations of the same logit that each round once already differ by up to
  one ulp; the second ulp covers the different accumulation order upstream.
* float16 (eps 9.8e-4, 11 significant bits): ``relative = absolute = 2**-8``,
  four ulps, by the same argument with fp16's finer grid but less headroom.

A divergence outside these bounds is a bug even if it "looks like noise".
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import torch


@dataclass(frozen=True)
class NearTieTolerance:
    absolute: float
    relative: float

    def bound(self, top_logit: float) -> float:
        """Largest logit gap that still counts as a near-tie next to ``top_logit``."""
        return self.absolute + self.relative * abs(top_logit)


#: Per compute dtype of the target model; see the module docstring for why.
NEAR_TIE_TOLERANCE: dict[torch.dtype, NearTieTolerance] = {
    torch.float32: NearTieTolerance(absolute=1e-5, relative=1e-5),
    torch.bfloat16: NearTieTolerance(absolute=2.0**-6, relative=2.0**-6),
    torch.float16: NearTieTolerance(absolute=2.0**-8, relative=2.0**-8),
}


def tolerance_for(dtype: torch.dtype) -> NearTieTolerance:
    try:
        return NEAR_TIE_TOLERANCE[dtype]
    except KeyError:
        known = ", ".join(str(d) for d in NEAR_TIE_TOLERANCE)
        raise ValueError(f"no near-tie tolerance for dtype {dtype}; known: {known}") from None


def top2_gap(logits_row: torch.Tensor) -> tuple[float, float]:  # [V] -> (top logit, top1 - top2)
    """The largest logit and its distance to the runner-up (non-finite entries ignored)."""
    row = logits_row.detach().double().flatten()
    row = row[torch.isfinite(row)]
    if row.numel() < 2:
        return (float(row.max()) if row.numel() else 0.0), float("inf")
    top = torch.topk(row, 2).values
    return float(top[0]), float(top[0] - top[1])


def is_near_tie(logits_row: torch.Tensor, dtype: torch.dtype) -> bool:  # logits_row: [V]
    """True when the top two logits are within ``dtype``'s rounding tolerance."""
    top, gap = top2_gap(logits_row)
    return gap <= tolerance_for(dtype).bound(top)


@dataclass(frozen=True)
class Divergence:
    """How two token sequences compare.

    ``kind`` is ``"identical"``, ``"near_tie"`` (allowed; tests report it) or
    ``"mismatch"`` (a bug).  For a divergence, ``index`` is the first position
    that differs, ``gap`` the logit distance between the two tokens there, and
    ``bound`` the tolerance it was held to.
    """

    kind: str
    index: int | None = None
    expected_token: int | None = None
    actual_token: int | None = None
    gap: float | None = None
    bound: float | None = None

    @property
    def allowed(self) -> bool:
        return self.kind != "mismatch"

    def describe(self) -> str:
        if self.kind == "identical":
            return "identical"
        return (
            f"{self.kind} at position {self.index}: expected token {self.expected_token}, got "
            f"{self.actual_token}; logit gap {self.gap:.3g} vs near-tie bound {self.bound:.3g}"
        )


def first_divergence(expected: Sequence[int], actual: Sequence[int]) -> int | None:
    """Index of the first differing position (a length difference counts), or None."""
    for i, (a, b) in enumerate(zip(expected, actual)):
        if a != b:
            return i
    return None if len(expected) == len(actual) else min(len(expected), len(actual))


def classify_divergence(
    expected: Sequence[int],
    actual: Sequence[int],
    reference_logits: torch.Tensor | None,  # [V]: the reference's logits where the two first differ
    dtype: torch.dtype,
) -> Divergence:
    """Decide whether ``actual`` may differ from ``expected`` (plain decoding's ids).

    Allowed only as a near-tie: at the first differing position both tokens'
    reference logits are within the tolerance of the row's top logit (which
    implies the top-2 gap is too).  Everything after that position is a
    different continuation and is not compared.  A sequence that merely stops
    early or runs longer is a mismatch.
    """
    index = first_divergence(expected, actual)
    if index is None:
        return Divergence("identical")
    if index >= min(len(expected), len(actual)):
        return Divergence("mismatch", index=index, gap=float("inf"), bound=0.0)
    exp_tok, act_tok = int(expected[index]), int(actual[index])
    if reference_logits is None:
        raise ValueError("classify_divergence needs the reference logits at the first divergence")
    row = reference_logits.detach().double().flatten()
    vocab = row.numel()
    if not (0 <= exp_tok < vocab and 0 <= act_tok < vocab):
        return Divergence("mismatch", index, exp_tok, act_tok, float("inf"), 0.0)
    top = float(row[torch.isfinite(row)].max()) if bool(torch.isfinite(row).any()) else 0.0
    bound = tolerance_for(dtype).bound(top)
    pair = row[[exp_tok, act_tok]]
    # A non-finite logit at either token (poisoned output) can never excuse a divergence.
    gap = float(top - pair.min()) if bool(torch.isfinite(pair).all()) else float("inf")
    kind = "near_tie" if gap <= bound else "mismatch"
    return Divergence(kind, index, exp_tok, act_tok, gap, bound)


# -- the measured rule: identity that keeps comparing ----------------------------------------------
#
# The blanket bounds above are a ceiling, not the rule.  The rule is measured: the same sequences'
# logits are computed twice by plain decoding in two batch compositions (one sequence alone in one
# forward, and every sequence together in verification-sized chunks), and the largest difference
# of a top-two logit between the two, over every position, is the rounding that batching really
# introduces on this backend, dtype and model.  A flip of the argmax between two computations
# needs the two logits to cross, so its reference gap is at most twice that difference: the
# near-tie bound is ``MARGIN * 2 * measured``, never above the ceiling.  MARGIN covers positions
# rounder than any in the measurement sample; tests hold it against a held-out sample.

#: how far past the largest measured rounding difference a near-tie may be (see above)
MARGIN = 2.0


@dataclass(frozen=True)
class NearTieRule:
    """When a flip of the argmax is rounding: a reference gap at most ``bound``."""

    bound: float  # largest reference logit gap a flip may have
    measured: float  # largest |difference| of a top-two logit between two plain batch compositions
    positions: int  # positions the measurement covered
    dtype: torch.dtype

    @classmethod
    def from_measurement(cls, deltas: Sequence[float], dtype: torch.dtype, top_logit: float) -> "NearTieRule":
        """The rule for ``deltas`` (one per measured position); capped at the dtype's ceiling at ``top_logit``."""
        measured = max(deltas, default=0.0)
        bound = min(MARGIN * 2.0 * measured, tolerance_for(dtype).bound(top_logit))
        return cls(bound=bound, measured=measured, positions=len(deltas), dtype=dtype)

    def describe(self) -> str:
        return (f"near-tie bound {self.bound:.3g} = {MARGIN:g} x 2 x the largest rounding difference "
                f"measured between two plain batch compositions ({self.measured:.3g} over {self.positions} "
                f"positions, {str(self.dtype).removeprefix('torch.')})")


def rounding_deltas(a: torch.Tensor, b: torch.Tensor) -> list[float]:  # a, b: [n, V] the same positions twice
    """Per position, the largest |a - b| over the top two tokens of either computation."""
    a, b = a.double(), b.double()
    tops = torch.cat([a.topk(2, dim=-1).indices, b.topk(2, dim=-1).indices], dim=-1)
    return (a.gather(-1, tops) - b.gather(-1, tops)).abs().amax(-1).tolist()


@dataclass(frozen=True)
class Flip:
    """A position where a method's token is not the reference argmax."""

    sequence: int
    position: int  # index in the sequence's output
    expected: int  # the reference argmax
    actual: int
    gap: float  # reference logit of ``expected`` minus that of ``actual``
    bound: float

    @property
    def near_tie(self) -> bool:
        return self.gap <= self.bound


@dataclass
class IdentityReport:
    """Teacher-forced comparison of outputs with the reference logits, every position."""

    positions: int = 0
    flips: list[Flip] = field(default_factory=list)
    length_mismatches: list[str] = field(default_factory=list)

    @property
    def near_ties(self) -> list[Flip]:
        return [f for f in self.flips if f.near_tie]

    @property
    def mismatches(self) -> list[Flip]:
        return [f for f in self.flips if not f.near_tie]

    @property
    def passed(self) -> bool:
        return not self.mismatches and not self.length_mismatches

    @property
    def near_tie_rate(self) -> float:
        return len(self.near_ties) / self.positions if self.positions else 0.0

    def merge(self, other: "IdentityReport") -> "IdentityReport":
        return IdentityReport(self.positions + other.positions, self.flips + other.flips,
                              self.length_mismatches + other.length_mismatches)

    def describe(self) -> str:
        text = (f"{self.positions} positions compared, {len(self.near_ties)} near-ties accepted, "
                f"{len(self.mismatches)} mismatches")
        first = self.mismatches[0] if self.mismatches else None
        if first is not None:
            text += (f"; first mismatch at sequence {first.sequence} position {first.position}: expected "
                     f"{first.expected}, got {first.actual}, gap {first.gap:.3g} vs bound {first.bound:.3g}")
        worst = max(self.flips, key=lambda f: f.gap, default=None)
        if worst is not None:
            text += (f" (largest flip gap {worst.gap:.3g} vs bound {worst.bound:.3g}: sequence {worst.sequence} "
                     f"position {worst.position}, {worst.expected} -> {worst.actual})")
        if self.length_mismatches:
            text += "; " + "; ".join(self.length_mismatches)
        return text

    def to_dict(self) -> dict:
        return {"positions": self.positions, "near_ties": len(self.near_ties), "mismatches": len(self.mismatches),
                "near_tie_rate": self.near_tie_rate, "length_mismatches": self.length_mismatches,
                "flips": [f.__dict__ for f in self.flips]}


def judge_teacher_forced(reference: torch.Tensor, tokens: Sequence[int], rule: NearTieRule,
                         sequence: int = 0) -> IdentityReport:
    """Compare ``tokens`` with the argmax of ``reference`` ([len(tokens), V]) at every position.

    ``reference[i]`` must be the target's logits on the method's own prefix (prompt + tokens[:i]),
    so a flip is judged where it happens and comparison goes on after it.
    """
    if reference.shape[0] != len(tokens):
        raise ValueError(f"{reference.shape[0]} reference rows for {len(tokens)} tokens")
    report = IdentityReport(positions=len(tokens))
    if not tokens:
        return report
    ref = reference.detach().double()
    ref = torch.where(torch.isfinite(ref), ref, torch.full_like(ref, -torch.inf))
    expected = ref.argmax(-1)
    actual = torch.tensor(list(tokens), dtype=torch.int64)
    if int(actual.min()) < 0 or int(actual.max()) >= ref.shape[1]:
        raise ValueError(f"a token is outside the reference's vocabulary of {ref.shape[1]}")
    rows = torch.arange(len(tokens))
    gaps = ref[rows, expected] - ref[rows, actual]
    for i in (expected != actual).nonzero().flatten().tolist():
        gap = float(gaps[i])
        report.flips.append(Flip(sequence, i, int(expected[i]), int(actual[i]),
                                 gap if gap == gap else float("inf"), rule.bound))
    return report
