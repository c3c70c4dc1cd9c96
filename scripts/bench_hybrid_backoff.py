"""The default hybrid (the bandit over ngram, suffix and every drafter in assets/) with and without its
exploration back-off, the hybrid on the built-in rules (the bare hybrid's policy before), suffix decoding
and plain decoding, engines interleaved pass by pass in one process (the VM's speed drifted by 20 % between
runs).

    .venv/bin/python scripts/bench_hybrid_backoff.py [--workload humaneval|chat] [--prompts 8]
        [--max-tokens 128] [--passes 3] [--backoffs 1,64] --json OUT.json

Each pass sends every prompt once, one request at a time (batch 1, T=0, EOS ignored) to each engine in
turn; an engine keeps what it learnt between passes (its bandit, its suffix cache), as a server would.
Prefix caching is emptied before each pass.  Tokens are compared with plain decoding's.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", choices=("humaneval", "chat"), default="humaneval")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--backoffs", default="1,64")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    from hyspec import LLM, SamplingParams
    from hyspec.bench.prompts import chat_prompts, humaneval_prompts

    # the default hybrid ({"method": "hybrid"}: the bandit over ngram, suffix and every drafter in assets/),
    # with the bandit's back-off at each --backoffs value, and the built-in rules (the old bare default)
    engines = {"plain": None, "suffix": {"method": "suffix"}}
    for b in (int(x) for x in args.backoffs.split(",")):
        engines[f"hybrid backoff {b}"] = {"method": "hybrid", "hybrid": {"bandit_max_backoff": b}}
    engines["hybrid rules"] = {"method": "hybrid", "hybrid": {"policy": "rules"}}
    llms = {name: LLM(speculative_config=cfg, kv_cache_bytes=512 << 20) for name, cfg in engines.items()}
    tokenizer = llms["plain"].tokenizer
    texts = humaneval_prompts() if args.workload == "humaneval" else chat_prompts(tokenizer.apply_chat_template)
    prompts = texts[:args.prompts]
    sp = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True)
    rates: dict[str, list[float]] = {name: [] for name in llms}
    outputs: dict[str, list] = {}
    for p in range(args.passes):
        for name, llm in llms.items():
            llm.reset_prefix_cache()
            t0 = time.perf_counter()
            outs = [llm.generate([q], sp)[0].outputs[0].token_ids for q in prompts]
            rates[name].append(sum(map(len, outs)) / (time.perf_counter() - t0))
            outputs.setdefault(name, [list(o) for o in outs])
            print(f"pass {p + 1} {name:22s} {rates[name][-1]:7.1f} tok/s", flush=True)
    report = {"workload": args.workload, "prompts": len(prompts), "max_tokens": args.max_tokens,
              "passes": args.passes, "tok_s": rates, "median": {n: statistics.median(r) for n, r in rates.items()},
              "identical": {n: outputs[n] == outputs["plain"] for n in llms}}
    med = report["median"]
    print(f"\nmedian of {args.passes} passes, tok/s (x plain, x suffix):")
    for name in llms:
        print(f"  {name:22s} {med[name]:7.1f}  {med[name] / med['plain']:.3f}  {med[name] / med['suffix']:.3f}"
              f"  {'identical' if report['identical'][name] else 'DIFFERENT'}")
    for llm in llms.values():
        llm.close()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0 if all(report["identical"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
