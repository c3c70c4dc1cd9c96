"""One timed configuration: the workload (full waves of a batch size) and what a run of it measured.

Throughput is end to end: generated tokens of one repeat (every wave, prefill
included) divided by that repeat's wall time; the configuration reports the
median over repeats with the spread.  Every request generates exactly
``max_tokens`` tokens (EOS ignored on both sides), so all engines do the same
work.  TTFT is per request, from submitting its wave to its first token.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from hyspec.bench.machine import MemoryPeak
from hyspec.bench.stats import Spread

WARMUP_TOKENS = 4  # an untimed wave first: lazy initialisation and first-call allocations are not timed


@dataclass(frozen=True)
class Workload:
    """Prompts (token ids) grouped into full waves of ``batch_size`` requests, run one wave at a time."""

    prompts: tuple[tuple[int, ...], ...]  # every request of one repeat, in order
    batch_size: int
    temperature: float
    max_tokens: int
    seed: int

    def __post_init__(self) -> None:
        if not self.prompts or len(self.prompts) % self.batch_size:
            raise ValueError(f"Workload: {len(self.prompts)} prompts do not fill waves of {self.batch_size}")

    @classmethod
    def build(cls, prompts: Sequence[Sequence[int]], batch_size: int, temperature: float, max_tokens: int,
              seed: int) -> "Workload":
        """Prompts cycled up to whole waves: ceil(len / batch_size) * batch_size requests."""
        count = -(-len(prompts) // batch_size) * batch_size
        return cls(tuple(tuple(prompts[i % len(prompts)]) for i in range(count)), batch_size, float(temperature),
                   max_tokens, seed)

    @property
    def waves(self) -> list[range]:
        return [range(i, i + self.batch_size) for i in range(0, len(self.prompts), self.batch_size)]

    def request_seed(self, index: int) -> int | None:
        """Sampled requests get a fixed seed per request (repeats sample the same); greedy ones none."""
        return None if self.temperature == 0 else self.seed + index

    def key(self) -> tuple[int, float]:
        return self.batch_size, self.temperature


@dataclass
class Measurement:
    """What the repeats of one configuration measured."""

    tokens_per_s: Spread
    generated_tokens: int  # per repeat
    ttft_s: Spread | None
    outputs: list[list[list[int]]]  # per repeat, per request: the generated token ids
    peak: MemoryPeak
    acceptance: dict[str, Any] | None = None  # spec-metric deltas over the timed repeats (hyspec methods)
    notes: list[str] = field(default_factory=list)


def timed_passes(workload: "Workload", repeats: int,
                 run_wave: Callable[[range], tuple[list[list[int]], list[float]]],
                 before_pass: Callable[[], None] | None = None, waves: list[range] | None = None,
                 ) -> tuple[list[float], list[float], list[list[list[int]]], int]:
    """``repeats`` timed passes over every wave of ``workload``, the same way for hyspec and its peers.

    ``run_wave(wave)`` generates one wave and returns its token ids per request and the TTFTs it
    measured.  ``before_pass()`` runs before each pass, untimed (hyspec: drafters forget what they
    learnt across requests, so a pass never drafts from an earlier pass's answers).  Returns
    tokens/s per pass, every TTFT, the outputs of each pass and the tokens generated in one pass.
    ``waves``: how a pass is cut (default ``workload.waves``; continuous batching passes one range).
    """
    rates: list[float] = []
    ttfts: list[float] = []
    outputs: list[list[list[int]]] = []
    generated = 0
    for _ in range(repeats):
        if before_pass is not None:
            before_pass()
        repeat_outputs: list[list[int]] = []
        generated = 0
        start = time.perf_counter()
        for wave in workload.waves if waves is None else waves:
            tokens, wave_ttfts = run_wave(wave)
            repeat_outputs += tokens
            generated += sum(len(t) for t in tokens)
            ttfts += wave_ttfts
        rates.append(generated / (time.perf_counter() - start))
        outputs.append(repeat_outputs)
    return rates, ttfts, outputs, generated


def acceptance_from_totals(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """Acceptance over an interval from two ``SpecMetrics.snapshot()["totals"]``.

    Per-position acceptance follows vLLM: drafts whose position j was
    accepted, divided by all drafts (so it can only fall with j); mean
    acceptance length is 1 + accepted tokens per draft (the 1: the bonus token).
    """
    drafts = after["drafts"] - before["drafts"]
    draft_tokens = after["draft_tokens"] - before["draft_tokens"]
    accepted = after["accepted_tokens"] - before["accepted_tokens"]
    pos_before = list(before["accepted_per_position"])
    pos_after = list(after["accepted_per_position"])
    pos_before += [0] * (len(pos_after) - len(pos_before))
    per_position = [(a - b) / drafts if drafts else 0.0 for a, b in zip(pos_after, pos_before)]
    return {"drafts": drafts, "draft_tokens": draft_tokens, "accepted_tokens": accepted,
            "acceptance_rate": accepted / draft_tokens if draft_tokens else None,
            "mean_acceptance_length": 1.0 + accepted / drafts if drafts else None,
            "per_position": per_position}
