"""Time of one target step as a function of batch size and verified tokens per sequence.

Shape of the model, and why.  A decode/verify step reads every weight once
however many tokens it processes, so at small token counts its time is almost
flat (memory-bound); past some total token count m* the matmuls saturate the
compute units and time grows linearly in the tokens (compute-bound).  That is
exactly the effect that makes speculation free at batch 1 and a loss at
batch 64.  So, with m = batch * tokens the tokens verified in one step:

    T(b, n) = c0 + c_seq * b + c_tok * m + c_knee * max(0, m - m*)

c0 is the fixed per-step cost (weights read, launches), c_seq per-sequence
work (sampling, metadata, attention over the context), c_tok the slope before
the knee and c_knee the extra slope after it.  All coefficients are kept
non-negative, so more tokens never look cheaper.  The knee is found by trying
each measured m as a candidate and keeping the best least-squares fit; a knee
is kept only when it beats the straight line clearly.  Rows are weighted by
1/T: the controller compares time *ratios*, so relative error is what counts.

A grid fit can be smooth where the hardware is not, so the model is refined
online: each observed step updates an EWMA of observed/predicted (cheap, every
step: tracks drift such as growing contexts), and every ``refit_every``
observations the model is refitted on the start-up profile plus a window of
recent steps, which corrects the shape where the engine actually operates.
"""
from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

import numpy as np

from hyspec.errors import HyspecError


@dataclass(frozen=True)
class StepSample:
    batch_size: int
    tokens_per_seq: float  # the mean over the batch: batch_size x tokens_per_seq is the step's total tokens
    seconds: float

    def __post_init__(self) -> None:
        if self.batch_size < 1 or self.tokens_per_seq < 1:
            raise HyspecError(f"StepSample: batch_size and tokens_per_seq must be >= 1, got "
                              f"{self.batch_size}, {self.tokens_per_seq}")
        if not (math.isfinite(self.seconds) and self.seconds > 0):
            raise HyspecError(f"StepSample: seconds must be a positive finite number, got {self.seconds}")


@dataclass(frozen=True)
class _Fit:
    c0: float
    c_seq: float
    c_tok: float
    c_knee: float
    knee: float  # m*; inf when the straight line won

    def __call__(self, batch: int, tokens: float) -> float:
        m = batch * tokens
        return self.c0 + self.c_seq * batch + self.c_tok * m + self.c_knee * max(0.0, m - self.knee)


# A knee must cut the weighted squared error by this factor to be kept over a straight line.
_KNEE_GAIN = 0.9
# Mean squared relative error below which a fit counts as exact (a 0.01 % RMS error).
_EXACT_FIT = 1e-8
# Knee candidates tried per fit.
_MAX_KNEES = 16
# Floor on any prediction: a fit may reach 0 at tiny m, and the controller divides by it.
_MIN_SECONDS = 1e-9


class CostModel:
    """Predicts seconds of one target step; fitted from a start-up profile, refined online.

    Until it has samples at two or more distinct token totals it is *flat*:
    verifying n tokens costs the same as 1 (the memory-bound assumption, which
    is optimistic, so speculation gets tried and measured).
    """

    def __init__(self, samples: Iterable[StepSample] = (), *, residual_alpha: float = 0.05,
                 refit_every: int = 256, window: int = 256):
        if not 0.0 < residual_alpha <= 1.0:
            raise HyspecError(f"CostModel: residual_alpha must be in (0, 1], got {residual_alpha}")
        if refit_every < 1 or window < 1:
            raise HyspecError("CostModel: refit_every and window must be >= 1")
        self.residual_alpha = residual_alpha
        self.refit_every = refit_every
        self._anchor: list[StepSample] = []
        self._online: deque[StepSample] = deque(maxlen=window)
        self._fit: _Fit | None = None
        self._flat_seconds = 1.0
        self._ratio = 1.0  # EWMA of observed / fitted since the last refit
        self._since_refit = 0
        samples = list(samples)
        if samples:
            self.fit(samples)

    # -- fitting -----------------------------------------------------------------------
    @classmethod
    def profile(cls, measure: Callable[[int, int], float], batch_sizes: Sequence[int] = (1, 2, 4, 8, 16, 32),
                token_counts: Sequence[int] = (1, 2, 3, 5, 9, 17), repeats: int = 2,
                budget_s: float | None = None, clock: Callable[[], float] = time.perf_counter,
                **kwargs) -> "CostModel":
        """Time ``measure(batch_size, tokens_per_seq) -> seconds`` on a grid and fit.

        One unrecorded call warms caches and kernels; each grid point keeps the
        fastest of ``repeats`` calls, since noise from other work only adds time.
        Points are timed cheapest first (fewest tokens in all); with ``budget_s``,
        no point is started once that much wall time has gone, so a slow or loaded
        machine fits on the small steps it measured and refines the rest online
        (a server that profiles for many minutes before it listens looks dead).
        """
        if repeats < 1:
            raise HyspecError(f"CostModel.profile: repeats must be >= 1, got {repeats}")
        if budget_s is not None and not budget_s > 0:
            raise HyspecError(f"CostModel.profile: budget_s must be > 0, got {budget_s}")
        start = clock()
        grid = cls.grid_order(batch_sizes, token_counts)
        measure(*grid[0])
        samples = []
        for b, n in grid:
            if budget_s is not None and samples and clock() - start > budget_s:
                break
            samples.append(StepSample(b, n, min(float(measure(b, n)) for _ in range(repeats))))
        return cls(samples, **kwargs)

    @staticmethod
    def grid_order(batch_sizes: Sequence[int], token_counts: Sequence[int]) -> list[tuple[int, int]]:
        """The (batch, tokens) points of a profile in the order they are timed: cheapest (fewest tokens) first."""
        return sorted(((b, n) for b in batch_sizes for n in token_counts), key=lambda p: (p[0] * p[1], p[0]))

    def fit(self, samples: Iterable[StepSample]) -> None:
        """Fit from scratch; these samples are kept as the anchor for later online refits."""
        self._anchor = list(samples)
        self._online.clear()
        self._refit()

    @property
    def num_anchor_samples(self) -> int:
        """How many start-up (grid) samples the model is anchored on."""
        return len(self._anchor)

    @property
    def fitted(self) -> bool:
        return self._fit is not None

    def coefficients(self) -> dict[str, float]:
        """The current fit (for logs and tests); empty while the model is flat."""
        if self._fit is None:
            return {}
        f = self._fit
        return {"c0": f.c0, "c_seq": f.c_seq, "c_tok": f.c_tok, "c_knee": f.c_knee, "knee": f.knee,
                "residual_ratio": self._ratio}

    def _refit(self) -> None:
        samples = self._anchor + list(self._online)
        self._since_refit = 0
        self._ratio = 1.0
        if samples:
            self._flat_seconds = float(np.mean([s.seconds for s in samples]))
        totals = {s.batch_size * s.tokens_per_seq for s in samples}
        self._fit = _fit_hinge(samples) if len(totals) >= 2 else None

    # -- use ---------------------------------------------------------------------------
    def predict(self, batch: int, tokens: float) -> float:
        """Seconds of one step verifying ``tokens`` per sequence (a mean: ``batch * tokens`` in all) for
        ``batch`` sequences."""
        if self._fit is None:
            return self._flat_seconds
        return max(_MIN_SECONDS, self._fit(batch, tokens) * self._ratio)

    def observe(self, batch: int, tokens: float, seconds: float) -> None:
        """Feed one measured step (cheap: an EWMA update; a refit every ``refit_every`` calls); ``tokens``:
        the mean per sequence, so that ``batch * tokens`` is what the step verified in all."""
        sample = StepSample(batch, tokens, float(seconds))
        self._online.append(sample)
        self._since_refit += 1
        if self._fit is None:
            totals = {s.batch_size * s.tokens_per_seq for s in self._anchor + list(self._online)}
            if len(totals) >= 2:
                self._refit()
            else:
                self._flat_seconds += self.residual_alpha * (sample.seconds - self._flat_seconds)
            return
        base = max(_MIN_SECONDS, self._fit(batch, tokens))
        self._ratio += self.residual_alpha * (sample.seconds / base - self._ratio)
        if self._since_refit >= self.refit_every:
            self._refit()


def _fit_hinge(samples: Sequence[StepSample]) -> _Fit:
    # One row per distinct (batch, tokens): the mean time, weighted by sqrt(count) (the mean of
    # count samples is that much less noisy) and by 1/T (relative error is what counts).
    groups: dict[tuple[int, int], list[float]] = {}
    for s in samples:
        groups.setdefault((s.batch_size, s.tokens_per_seq), []).append(s.seconds)
    b = np.array([k[0] for k in groups], dtype=np.float64)
    m = b * np.array([k[1] for k in groups], dtype=np.float64)
    y = np.array([sum(v) / len(v) for v in groups.values()], dtype=np.float64)
    w = np.sqrt(np.array([len(v) for v in groups.values()], dtype=np.float64)) / y
    base = np.stack([np.ones_like(m), b, m], axis=1)
    coef, sse = _nonneg_lstsq(base * w[:, None], y * w)
    best = _Fit(float(coef[0]), float(coef[1]), float(coef[2]), 0.0, math.inf)
    if sse / len(y) < _EXACT_FIT:
        return best  # the line is already exact; a knee would only fit rounding
    best_sse = sse * _KNEE_GAIN

    def try_knee(knee: float) -> None:
        nonlocal best, best_sse
        x = np.concatenate([base, np.maximum(0.0, m - knee)[:, None]], axis=1)
        coef, sse = _nonneg_lstsq(x * w[:, None], y * w)
        if sse < best_sse:
            best, best_sse = _Fit(*(float(c) for c in coef), float(knee)), sse

    # candidate knees: measured totals that leave at least two larger totals to fit the slope.
    # Coarse to fine, to bound the cost of a refit: _MAX_KNEES spread evenly, then every
    # candidate between the best coarse one's neighbours.
    knees = np.unique(m)[:-2]
    coarse = np.unique(np.linspace(0, len(knees) - 1, min(len(knees), _MAX_KNEES)).round().astype(int))
    for i in coarse:
        try_knee(knees[i])
    if math.isfinite(best.knee) and len(coarse) < len(knees):
        at = int(np.searchsorted(coarse, int(np.searchsorted(knees, best.knee))))
        lo = coarse[at - 1] if at > 0 else 0
        hi = coarse[at + 1] if at + 1 < len(coarse) else len(knees) - 1
        for i in range(lo + 1, hi):
            if i not in coarse:
                try_knee(knees[i])
    return best


def _nonneg_lstsq(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, float]:
    """Least squares with every coefficient >= 0, by dropping the most negative column and refitting.

    Not a general NNLS solver, but exact enough for four columns whose
    negative coefficients only appear when a column is not needed.
    """
    active = list(range(x.shape[1]))
    coef = np.zeros(x.shape[1])
    while active:
        sol, *_ = np.linalg.lstsq(x[:, active], y, rcond=None)
        if (sol >= 0).all():
            coef[:] = 0.0
            coef[active] = sol
            break
        del active[int(np.argmin(sol))]
    resid = y - x @ coef
    return coef, float(resid @ resid)
