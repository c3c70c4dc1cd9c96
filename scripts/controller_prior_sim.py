"""The goodput controller alone at batch 1 on a CPU-like step cost (5 verified rows ~1.7 plain steps), drafts
accepted with a given first-position and deeper conditional rate: drafted share of steps and tokens/s with the
controller's acceptance estimates as they are (the prior worth ``PRIOR_STEPS`` steps) and with the EWMA that
decayed from the prior (before 2026-12-06), and with other prior weights.  No engine, no timing: seconds are
the cost model's.  Chose ``PRIOR_STEPS`` (core/policy/controller.py).

    .venv/bin/python scripts/controller_prior_sim.py [--steps 100] [--seeds 60]
"""
from __future__ import annotations

import argparse
import random
import statistics

from hyspec.policy.controller import CostModel, GoodputController, StepSample
from hyspec.spec.config import SpeculativeConfig

WORKLOADS = {"code-like": (0.6, 0.85), "middling": (0.4, 0.6), "weak": (0.3, 0.5), "chat-like": (0.2, 0.4)}


def step_seconds(batch: int, tokens: int) -> float:
    return 0.008 * (1 + 0.175 * (batch * tokens - 1))


class DecayFromPrior(GoodputController):
    """The estimate before: per position, an EWMA that starts at the prior (positions never reached keep it)."""

    def _acceptance(self, st, positions=None):
        return list(self._old(st)[:positions])

    def _old(self, st):
        if not hasattr(st, "old"):
            st.old = [self.prior] * self.max_tokens
        return st.old

    def observe_acceptance(self, method, accepted_per_position, num_drafts, drafted_per_position=None):
        old = self._old(self._state(method))
        reached = num_drafts
        for j, accepted in enumerate(accepted_per_position[:len(old)]):
            if reached > 0:
                old[j] += self.alpha * (accepted / reached - old[j])
            reached = accepted


def with_prior_steps(m: float) -> type:
    import hyspec.policy.controller as controller

    class Weighted(GoodputController):
        def _acceptance(self, st, positions=None):
            saved, controller.PRIOR_STEPS = controller.PRIOR_STEPS, m
            try:
                return super()._acceptance(st, positions)
            finally:
                controller.PRIOR_STEPS = saved
    return Weighted


def run(cls: type, first: float, deeper: float, steps: int, seed: int) -> tuple[float, float]:
    rng = random.Random(seed)
    cfg = SpeculativeConfig.from_dict({"method": "ngram", "num_speculative_tokens": 5})
    c = cls(cfg, CostModel([StepSample(1, n, step_seconds(1, n)) for n in range(1, 7)]))
    seconds = tokens = drafted = 0.0
    for _ in range(steps):
        k = c.choose("ngram", 1)
        if not k:
            tokens, seconds = tokens + 1, seconds + step_seconds(1, 1)
            continue
        drafted += 1
        accepted, ok = [], True
        for j in range(k):
            ok = ok and rng.random() < (first if j == 0 else deeper)
            accepted.append(int(ok))
        c.observe_acceptance("ngram", accepted, 1)
        c.observe_draft_time("ngram", k, 0.0002)
        tokens += 1 + sum(accepted)
        seconds += step_seconds(1, k + 1) + 0.0002
    return drafted / steps, tokens / seconds


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--seeds", type=int, default=60)
    args = ap.parse_args(argv)
    variants = {"decay from prior (before)": DecayFromPrior, "as configured": GoodputController}
    variants.update({f"prior {m:g} steps": with_prior_steps(m) for m in (1, 2, 8)})
    print(f"plain decoding: {1 / step_seconds(1, 1):.1f} tok/s; {args.steps} steps, mean of {args.seeds} seeds")
    for name, cls in variants.items():
        cells = []
        for workload, (first, deeper) in WORKLOADS.items():
            runs = [run(cls, first, deeper, args.steps, s) for s in range(args.seeds)]
            cells.append(f"{workload} {statistics.fmean(r[1] for r in runs):6.1f} "
                         f"({statistics.fmean(r[0] for r in runs):.2f} drafted)")
        print(f"{name:26s} " + " | ".join(cells))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
