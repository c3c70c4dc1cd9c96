"""The vLLM hybrid's decisions on simulated vLLM CPU steps: the bandit it replaced against the cost model.

    .venv/bin/python scripts/vllm_hybrid_sim.py

    .venv/bin/python scripts/vllm_hybrid_sim.py 0.011   # seconds per token: a dearer token

A decode step takes 60 ms + 4.4 ms per token scored (rows + drafts: vLLM plain's decode steps here, its TTFT
taken out, docs/results/2026-12-06/vllm-bench/), every drafting arm drafts 4 tokens per row, each accepted at 0.68 given
the ones before it were (a mean acceptance length of ~2.7, as vLLM + hyspec measured at batch 8), and the match
length the bandit classed steps by varies per step.  Batch 1 for 480 steps (3 passes of 8 prompts x ~20 steps),
then batch 8 and batch 32 for 60 steps each (3 passes of ~20), as `hyspec bench` runs them.  The bandit is read
from git at the commit before the cost model replaced it; no timing of this machine is involved.
"""
from __future__ import annotations

import importlib.util
import random
import subprocess
import sys
import tempfile
from pathlib import Path

BANDIT_COMMIT = "0f2d160~1"  # core/vllm/hybrid.py as the bandit
FIXED, ACCEPT, K = 0.060, 0.68, 4
PER_TOKEN = float(sys.argv[1]) if len(sys.argv) > 1 else 0.0044  # seconds per token scored (see the docstring)
SCHEDULE = ((1, 480), (8, 60), (32, 60))


def step_seconds(tokens: int) -> float:
    return FIXED + PER_TOKEN * tokens


def accepted(rng: random.Random, drafted: int) -> int:
    n = 0
    while n < drafted and rng.random() < ACCEPT:
        n += 1
    return n


def bandit_module():
    source = subprocess.run(["git", "show", f"{BANDIT_COMMIT}:core/vllm/hybrid.py"], check=True,
                            capture_output=True, text=True, cwd=Path(__file__).resolve().parents[1]).stdout
    path = Path(tempfile.mkdtemp()) / "bandit_hybrid.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("bandit_hybrid", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def run_bandit(rng: random.Random) -> list[tuple[int, float, float]]:
    hybrid = bandit_module().VllmHybrid(("suffix", "ngram"), max_num_seqs=256, load_threshold=0.75,
                                        explore_fraction=0.1)
    now, out = 0.0, []
    for batch, steps in SCHEDULE:
        ids, sampled, start, tokens, drafted_steps = [f"b{batch}-{i}" for i in range(batch)], [1] * batch, now, 0, 0
        for s in range(steps):
            hybrid.observe(ids, sampled, now)
            arm = hybrid.choose(ids, 150 + s, rng.choice([0, 2, 5, 12, 20]), now)
            drafted = 0 if arm == "none" else K
            drafted_steps += bool(drafted)
            sampled = [accepted(rng, drafted) + 1 for _ in ids]
            tokens += sum(sampled)
            now += step_seconds(batch * (1 + drafted))
        out.append((batch, drafted_steps / steps, tokens / (now - start) / (batch / step_seconds(batch))))
    return out


def run_cost_model(rng: random.Random) -> list[tuple[int, float, float]]:
    from hyspec.vllm.hybrid import Candidate, VllmHybrid

    hybrid = VllmHybrid(max_num_seqs=256, load_threshold=0.75, explore_interval=64, min_gain=0.02)
    now, out = 0.0, []
    for batch, steps in SCHEDULE:
        ids, sampled, start, tokens, drafted_steps = [f"b{batch}-{i}" for i in range(batch)], [1] * batch, now, 0, 0
        for _ in range(steps):
            hybrid.observe(ids, sampled, now)
            match = rng.choice([0, 2, 5, 12, 20])
            plan = hybrid.plan({r: [Candidate("suffix", tuple(range(K)), (0.7,) * K, 0, match)] for r in ids}, batch)
            hybrid.sent(ids, plan, now)
            drafted_steps += bool(plan)
            sampled = [accepted(rng, len(plan[r].tokens) if r in plan else 0) + 1 for r in ids]
            tokens += sum(sampled)
            now += step_seconds(batch + sum(len(c.tokens) for c in plan.values()))
        out.append((batch, drafted_steps / steps, tokens / (now - start) / (batch / step_seconds(batch))))
    return out


def main() -> int:
    for name, run in (("bandit (before)", run_bandit), ("cost model (now)", run_cost_model)):
        for batch, share, speed in run(random.Random(0)):
            print(f"{name:17s} batch {batch:>2}: drafted {share:4.0%} of the steps, {speed:.2f}x plain decoding")
    return 0


if __name__ == "__main__":
    sys.exit(main())
