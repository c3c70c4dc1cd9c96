"""A/B: the cost model taught each verification step's mean tokens per sequence (now) against its longest
feed (before), suffix decoding at batch 8, engines interleaved pass by pass in one process.

Both suffix engines run the same code; the "before" one has ``hyspec.spec.decoder.mean_tokens_per_seq``
swapped for the old rule (the longest feed) while its passes run.  Every output is compared with plain
decoding's.

    .venv/bin/python docs/results/2026-12-05/cost-model-rows/ab.py --workloads humaneval,chat,mixed --rounds 3
"""
from __future__ import annotations

import argparse
import json

import hyspec.spec.decoder as decoder_module
from hyspec.bench.interleaved_ab import (close_and_save, interleaved_rates, medians, ratio, rounded, waves_of,
                                         workload_prompts)


def main() -> None:
    from hyspec import LLM, SamplingParams

    ap = argparse.ArgumentParser()
    ap.add_argument("--workloads", default="humaneval,chat,mixed")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--num-prompts", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out")
    args = ap.parse_args()

    mean_rule = decoder_module.mean_tokens_per_seq

    def longest_rule(feeds) -> float:  # what the decoder recorded before
        return max(len(f.tokens) for f in feeds)

    spec = {"method": "suffix", "num_speculative_tokens": 64, "suffix_decoding_max_tree_depth": 64}
    engines = {"plain": LLM(quantization="a8"), "suffix_before": LLM(quantization="a8", speculative_config=spec),
               "suffix_now": LLM(quantization="a8", speculative_config=spec)}
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True)
    out = {"batch_size": args.batch_size, "num_prompts": args.num_prompts, "max_tokens": args.max_tokens,
           "rounds": args.rounds, "workloads": {}}
    bs = args.batch_size
    for wl in args.workloads.split(","):
        waves = waves_of(workload_prompts(wl, args.num_prompts), bs)
        for llm in engines.values():  # warm-up wave
            decoder_module.mean_tokens_per_seq = mean_rule
            llm.generate(waves[0], params, use_tqdm=False)
        def rule(name: str, _llm) -> None:
            decoder_module.mean_tokens_per_seq = longest_rule if name == "suffix_before" else mean_rule

        rates, mismatches = interleaved_rates(engines, waves, params, args.rounds, before_pass=rule)
        decoder_module.mean_tokens_per_seq = mean_rule
        med = medians(rates)
        row = {"tok_s": rounded(rates), "median": med,
               "before_x_plain": ratio(med, "suffix_before", "plain"), "now_x_plain": ratio(med, "suffix_now", "plain"),
               "now_x_before": ratio(med, "suffix_now", "suffix_before"),
               "outputs_differing_from_plain": mismatches}
        out["workloads"][wl] = row
        print(wl, json.dumps(row), flush=True)
    close_and_save(engines, out, args.out)


if __name__ == "__main__":
    main()
