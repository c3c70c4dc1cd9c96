"""A/B: the bandit's evidence aged by its class's steps (now) or by the arm's own observations (before),
batch 1, engines interleaved pass by pass in one process: plain, suffix, hybrid before, hybrid now.

The hybrid is `hyspec bench`'s (the bandit over ngram, suffix and every drafter in assets/), with
`--quantization a8` and suffix depth 64 as issue 16's runs.  Each pass: the suffix caches emptied, the
bandits keep what they learnt (as in a server).  Every output is compared with plain decoding's.

    .venv/bin/python docs/results/2026-12-05/bandit-aging/ab.py --workloads agentic,mixed,chat --rounds 3
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
    ap.add_argument("--workloads", default="agentic,mixed,chat")
    ap.add_argument("--num-prompts", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out")
    args = ap.parse_args()

    extra = {"suffix_decoding_max_tree_depth": 64}
    settings = BenchSettings(num_prompts=args.num_prompts, max_tokens=args.max_tokens, speculative_config_extra=extra)
    drafters = resolve_drafters(settings, True)[0]
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True)
    out = {"num_prompts": args.num_prompts, "max_tokens": args.max_tokens, "rounds": args.rounds, "workloads": {}}
    for wl in args.workloads.split(","):
        engines = {"plain": LLM(quantization="a8"),
                   "suffix": LLM(quantization="a8", speculative_config=speculative_config("suffix", settings, drafters)),
                   "hybrid_before": LLM(quantization="a8", speculative_config=speculative_config("hybrid", settings, drafters)),
                   "hybrid_now": LLM(quantization="a8", speculative_config=speculative_config("hybrid", settings, drafters))}
        engines["hybrid_before"].engine.spec.dispatcher.bandit.age_by_class_steps = False
        prompts = workload_prompts(wl, args.num_prompts)
        for llm in engines.values():  # warm-up request
            llm.generate(prompts[:1], params, use_tqdm=False)
        rates, mismatches = interleaved_rates(engines, waves_of(prompts, 1), params, args.rounds)
        med = medians(rates)
        row = {"tok_s": rounded(rates), "median": med,
               "before_x_suffix": ratio(med, "hybrid_before", "suffix"), "now_x_suffix": ratio(med, "hybrid_now", "suffix"),
               "before_x_plain": ratio(med, "hybrid_before", "plain"), "now_x_plain": ratio(med, "hybrid_now", "plain"),
               "now_x_before": ratio(med, "hybrid_now", "hybrid_before"),
               "outputs_differing_from_plain": mismatches}
        out["workloads"][wl] = row
        print(wl, json.dumps(row), flush=True)
        close_and_save(engines, out, None)
    close_and_save({}, out, args.out)


if __name__ == "__main__":
    main()
