"""The ceiling of speculation on this machine: an oracle drafter that always drafts the exact tokens plain
decoding will commit, verified by the real engine, engines interleaved pass by pass in one process.

Why: issues 14 and 16 set speed goals (2.5x plain at batch 1; suffix >= 1.5x ngram at batch 8) and every
drafter missed them.  Acceptance is only half of the reason: a verified row is not free on a 2-core CPU.
An oracle removes the drafter from the question -- every drafted token is accepted and drafting costs
nothing -- so what it reaches with k drafted tokens per step is the most ANY drafter can reach with k,
on these prompts, this engine and this CPU.  Its outputs are checked token for token against plain
decoding (they must be identical: the oracle only drafts, the target still verifies).

The oracle is registered through the public method registry (hyspec.spec.registry.register), with the
goodput controller off so that every step verifies exactly k drafted tokens (fewer at the end of a
request).  Prefix caching is on and emptied before every pass, as in ``hyspec bench`` (the first version
of this script, aa340c2, left it off -- the engine's default -- so its agentic re-runs prefilled in full;
its figures were replaced).  The oracle is ``hyspec.bench.ceiling``'s, which ``hyspec bench --ceiling K``
adds to any run.

    .venv/bin/python docs/results/2026-12-05/speculation-ceiling/ceiling.py --workload humaneval \
        --batch-size 1 --ks 1,3,7,15,31 --out humaneval-bs1.json
"""
from __future__ import annotations

import argparse
import json

from hyspec.bench.ceiling import Answers, oracle_registered, speculative_config
from hyspec.bench.interleaved_ab import (close_and_save, interleaved_rates, medians, ratio, rounded, waves_of,
                                         workload_prompts)


def main() -> None:
    from hyspec import LLM, SamplingParams

    ap = argparse.ArgumentParser()
    ap.add_argument("--workload", default="humaneval")
    ap.add_argument("--batch-size", type=int, default=1)
    ap.add_argument("--num-prompts", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--ks", default="1,3,7,15,31")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--quantization", default="a8", help="a8 (8-bit activations) or none (fp32 activations)")
    ap.add_argument("--out")
    args = ap.parse_args()

    prompts = workload_prompts(args.workload, args.num_prompts)
    bs = args.batch_size
    waves = waves_of(prompts, bs)
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True)

    quant = None if args.quantization == "none" else args.quantization
    engines = {"plain": LLM(quantization=quant, enable_prefix_caching=True)}
    answers = Answers()  # the reference: plain decoding's outputs, by prompt
    answers.set(prompts, [o.outputs[0].token_ids for wave in waves
                          for o in engines["plain"].generate(wave, params, use_tqdm=False)])
    with oracle_registered(answers):
        for k in (int(k) for k in args.ks.split(",")):
            engines[f"oracle_k{k}"] = LLM(quantization=quant, enable_prefix_caching=True,
                                          speculative_config=speculative_config(k))
    for llm in engines.values():  # warm-up wave
        llm.generate(waves[0], params, use_tqdm=False)

    rates, mismatches = interleaved_rates(engines, waves, params, args.rounds,
                                          before_pass=lambda _name, llm: llm.reset_prefix_cache())
    med = medians(rates)
    acceptance = {name: {key: llm.engine.spec.metrics.snapshot()["totals"][key]
                         for key in ("drafts", "draft_tokens", "accepted_tokens")}
                  for name, llm in engines.items() if name != "plain"}
    out = {"workload": args.workload, "quantization": args.quantization, "batch_size": bs,
           "num_prompts": args.num_prompts, "max_tokens": args.max_tokens, "rounds": args.rounds,
           "tok_s": rounded(rates), "median": med,
           "x_plain": {name: ratio(med, name, "plain") for name in med},
           "acceptance_totals_all_passes": acceptance, "outputs_differing_from_plain": mismatches}
    print(json.dumps(out), flush=True)
    close_and_save(engines, out, args.out)


if __name__ == "__main__":
    main()
