"""Summaries of repeated measurements: the median with its spread (min/max and the interquartile range)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence


def quantile(sorted_values: Sequence[float], q: float) -> float:
    """Linear-interpolation quantile (numpy's default) of already sorted values."""
    if not sorted_values:
        raise ValueError("quantile of no values")
    pos = q * (len(sorted_values) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


@dataclass(frozen=True)
class Spread:
    median: float
    min: float
    max: float
    q1: float
    q3: float
    runs: tuple[float, ...]

    @classmethod
    def of(cls, values: Sequence[float]) -> "Spread":
        if not values:
            raise ValueError("Spread.of needs at least one value")
        s = sorted(float(v) for v in values)
        return cls(median=quantile(s, 0.5), min=s[0], max=s[-1], q1=quantile(s, 0.25), q3=quantile(s, 0.75),
                   runs=tuple(float(v) for v in values))

    def to_dict(self) -> dict[str, Any]:
        return {"median": self.median, "min": self.min, "max": self.max, "q1": self.q1, "q3": self.q3,
                "runs": list(self.runs)}


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or not denominator:
        return None
    return numerator / denominator


def cost_per_million_tokens(tokens_per_s: float | None, price_per_hour: float | None) -> float | None:
    """What a million generated tokens cost at ``price_per_hour`` for the whole machine."""
    if price_per_hour is None or not tokens_per_s:
        return None
    return price_per_hour / 3600.0 / tokens_per_s * 1e6
