"""Losslessness at temperature > 0 through the engine: ``LLM.generate`` against the exact law.

``core/conformance/stats.py`` tests the verifier on toy tables; this tests
everything a sampled request goes through -- the drafter's q, the tree, the
verify op, the bonus token, KV commit and the next step's drafting -- by
sending thousands of seeded requests for one prompt through ``LLM.generate``
and comparing the first three emitted tokens with the law computed from the
target's own logits (the plain engine's, teacher-forced on every prefix in the
support):

* the joint law of the first two tokens, ``P(y1) P(y2 | y1)``;
* the marginals of y2 and y3 (``sum P(y1, y2) P(y3 | y1, y2)``).

y1 comes from the prefill; y2 and y3 come from verification (drafting starts
at the second token), so every drafting path is in the law being tested.

Threshold and power.  An outcome of exact probability p has a frequency with
standard deviation s = sqrt(p (1 - p) / n).  It fails when |freq - p| > Z s +
1/n (any occurrence of a p = 0 outcome fails: that alone catches a sampler
that ignores top-k or top-p).  A shift of ``power(n)`` in any one outcome's
probability -- a total-variation distance of at least that -- is detected with
probability 0.99 (the threshold plus 2.33 s at the largest s).  With Z = 5 over
~100 outcomes a false alarm has probability ~1e-4; the seeds are fixed, so the
verdict is deterministic on a given machine.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Sequence

import torch
from hyspec import SamplingParams
from hyspec.conformance.identity import reference_logits
from hyspec.ops.sampling import process_logits

if TYPE_CHECKING:
    from hyspec.engine.engine import LLMEngine

Z = 5.0
#: the sampling setting of every request: temperature, top-k and top-p all in play
PARAMS = dict(temperature=0.8, top_k=8, top_p=0.9)
DEFAULT_SAMPLES = 3500  # default suite: detects a <= 5-point shift on the tiny target (power() says exactly)
FULL_SAMPLES = 30000  # slow tier: ~1.6 points on the tiny target


@dataclass
class ExactLaw:
    joint12: dict[tuple[int, int], float]  # P(y1, y2) over the support
    y2: dict[int, float]
    y3: dict[int, float]

    def max_sd(self, n: int) -> float:
        ps = [*self.joint12.values(), *self.y2.values(), *self.y3.values()]
        return max((p * (1 - p) / n) ** 0.5 for p in ps)


def power(law: ExactLaw, n: int) -> float:
    """The smallest shift in one outcome's probability detected with probability 0.99 at ``n`` samples."""
    return (Z + 2.33) * law.max_sd(n) + 1.0 / n


def _processed(logits: torch.Tensor) -> torch.Tensor:  # [R, V] -> [R, V] fp64 probabilities
    r = logits.shape[0]
    probs = process_logits(logits.float(), torch.full((r,), PARAMS["temperature"]),
                           torch.full((r,), PARAMS["top_k"], dtype=torch.int64), torch.full((r,), PARAMS["top_p"]),
                           torch.zeros(r))
    return probs.double()


#: ``(logits [V], output tokens so far) -> logits``: a sampling control written out for the law (e.g. a penalty)
Adjust = Callable[[torch.Tensor, list[int]], torch.Tensor]


def exact_law(engine: "LLMEngine", prompt: Sequence[int], adjust: Adjust | None = None) -> ExactLaw:
    """The law of the first three tokens, from ``engine``'s plain logits on every prefix in the support;
    ``adjust`` changes each position's logits given the output before it, before temperature and filters."""
    prompt = list(prompt)

    def position(logits: torch.Tensor, output: list[int]) -> torch.Tensor:  # [1, V] -> [V] fp64
        if adjust is not None:
            logits = adjust(logits[0].float(), output)[None]
        return _processed(logits)[0]

    p1 = position(reference_logits(engine, [prompt], [[0]])[0][:1], [])
    firsts = p1.nonzero().flatten().tolist()
    rows = reference_logits(engine, [prompt] * len(firsts), [[t, 0] for t in firsts])
    joint12, y2, y3 = {}, {}, {}
    pairs = []
    for t1, r in zip(firsts, rows):
        p2 = position(r[1:2], [t1])
        for t2 in p2.nonzero().flatten().tolist():
            joint12[(t1, t2)] = float(p1[t1] * p2[t2])
            y2[t2] = y2.get(t2, 0.0) + joint12[(t1, t2)]
            pairs.append((t1, t2))
    rows3 = reference_logits(engine, [prompt] * len(pairs), [[t1, t2, 0] for t1, t2 in pairs])
    for (t1, t2), r in zip(pairs, rows3):
        p3 = position(r[2:3], [t1, t2])
        for t3 in p3.nonzero().flatten().tolist():
            y3[t3] = y3.get(t3, 0.0) + joint12[(t1, t2)] * float(p3[t3])
    return ExactLaw(joint12, y2, y3)


def sample_through_generate(llm: Any, prompt: Sequence[int], n: int, seed: int = 0,
                            max_tokens: int = 3, **controls: Any) -> list[list[int]]:
    """``n`` seeded requests for ``prompt`` through ``LLM.generate``; the first three tokens of each.
    ``max_tokens`` > 3 lets drafts reach past the third token (the law is still the first three's);
    ``controls``: more SamplingParams fields (a penalty: then give exact_law the same as ``adjust``)."""
    params = [SamplingParams(**PARAMS, seed=seed * 1_000_003 + i, max_tokens=max(3, max_tokens), ignore_eos=True,
                             **controls) for i in range(n)]
    return [o.outputs[0].token_ids[:3] for o in llm.generate([list(prompt)] * n, params)]


@dataclass
class LawComparison:
    worst: float  # worst |freq - p| / threshold over every outcome; <= 1 passes
    where: str
    samples: int
    power: float

    @property
    def passed(self) -> bool:
        return self.worst <= 1.0

    def describe(self) -> str:
        return (f"{self.samples} requests through LLM.generate: worst outcome at {self.worst:.2f}x the {Z:g}-sigma "
                f"threshold ({self.where}); detects a {self.power:.1%} shift in any outcome")


def compare(samples: list[list[int]], law: ExactLaw) -> LawComparison:
    n = len(samples)
    if any(len(s) != 3 for s in samples):
        short = sum(len(s) != 3 for s in samples)
        return LawComparison(float("inf"), f"{short} requests did not return 3 tokens", n, power(law, n))
    observed: dict[str, dict[Any, int]] = {"y1y2": {}, "y2": {}, "y3": {}}
    for y1, y2, y3 in samples:
        for name, key in (("y1y2", (y1, y2)), ("y2", y2), ("y3", y3)):
            observed[name][key] = observed[name].get(key, 0) + 1
    exact = {"y1y2": law.joint12, "y2": law.y2, "y3": law.y3}
    worst, where = 0.0, ""
    for name, counts in observed.items():
        p_of = exact[name]
        for key in set(counts) | set(p_of):
            p, freq = p_of.get(key, 0.0), counts.get(key, 0) / n
            if p == 0.0:
                ratio = float("inf") if freq > 0 else 0.0
            else:
                ratio = abs(freq - p) / (Z * (p * (1 - p) / n) ** 0.5 + 1.0 / n)
            if ratio > worst:
                worst, where = ratio, f"{name} outcome {key}: frequency {freq:.4f} vs p {p:.4f}"
    return LawComparison(worst, where or "every outcome", n, power(law, n))


__all__ = ["DEFAULT_SAMPLES", "ExactLaw", "FULL_SAMPLES", "LawComparison", "PARAMS", "Z", "compare", "exact_law", "lookup_prompt",
           "power", "sample_through_generate"]


def lookup_prompt(engine: "LLMEngine", base: Sequence[int], rounds: int = 4) -> list[int]:
    """``base`` followed by every token y1 can be, so prompt lookup (ngram) finds a match for any y1.

    The support of y1 depends on the prompt, so the appended set grows until it covers it.
    """
    covered: list[int] = []
    prompt = list(base)
    for _ in range(rounds):
        support = _processed(reference_logits(engine, [prompt], [[0]])[0])[0].nonzero().flatten().tolist()
        missing = [t for t in support if t not in set(prompt)]
        if not missing:
            return prompt
        covered += missing
        prompt = list(base) + covered
    return prompt
