"""A/B: a scored method (suffix) whose drafts were sized to nothing 4 steps running drafts one step in 4 until
one is kept (now), against drafting every step (before: ``controller.draft_one_in = 1``), engines
interleaved pass by pass in one process: plain, suffix before, suffix now (and the bench's hybrid before /
now with --hybrid).  Batch sizes as given (waves), 16 requests x 96 tokens, a8, suffix depth 64.

    .venv/bin/python docs/results/2026-12-05/suffix-skip-empty/ab.py --workloads humaneval,chat,agentic,mixed \\
        --batch-sizes 1,8 --rounds 3
"""
from __future__ import annotations

import argparse
import json

from hyspec.bench.interleaved_ab import (close_and_save, interleaved_rates, medians, ratio, rounded, waves_of,
                                         workload_prompts)


def main() -> None:
    from hyspec import LLM, SamplingParams
    from hyspec.bench.hyspec_runs import speculative_config
    from hyspec.bench.runner import resolve_drafters
    from hyspec.bench.settings import BenchSettings

    ap = argparse.ArgumentParser()
    ap.add_argument("--workloads", default="humaneval,chat,agentic,mixed")
    ap.add_argument("--batch-sizes", default="1,8")
    ap.add_argument("--num-prompts", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out")
    args = ap.parse_args()

    extra = {"suffix_decoding_max_tree_depth": 64}
    settings = BenchSettings(num_prompts=args.num_prompts, max_tokens=args.max_tokens, speculative_config_extra=extra)
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True)
    suffix = speculative_config("suffix", settings, {})
    engines = {"plain": LLM(quantization="a8"), "suffix_before": LLM(quantization="a8", speculative_config=suffix),
               "suffix_now": LLM(quantization="a8", speculative_config=suffix)}
    engines["suffix_before"].engine.spec.controller.draft_one_in = 1
    out = {"num_prompts": args.num_prompts, "max_tokens": args.max_tokens, "rounds": args.rounds, "rows": []}
    for wl in args.workloads.split(","):
        prompts = workload_prompts(wl, args.num_prompts)
        for bs in [int(b) for b in args.batch_sizes.split(",")]:
            waves = waves_of(prompts, bs)
            for llm in engines.values():
                llm.generate(waves[0], params, use_tqdm=False)
            rates, mismatches = interleaved_rates(engines, waves, params, args.rounds)
            med = medians(rates)
            row = {"workload": wl, "batch_size": bs, "tok_s": rounded(rates),
                   "median": med, "before_x_plain": ratio(med, "suffix_before", "plain"),
                   "now_x_plain": ratio(med, "suffix_now", "plain"), "now_x_before": ratio(med, "suffix_now", "suffix_before"),
                   "outputs_differing_from_plain": mismatches}
            out["rows"].append(row)
            print(json.dumps(row), flush=True)
    close_and_save(engines, out, args.out)


if __name__ == "__main__":
    main()
