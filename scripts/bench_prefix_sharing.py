"""In-batch prefix sharing (core/engine/scheduler.py) on and off, interleaved in one process.

    .venv/bin/python scripts/bench_prefix_sharing.py [--workloads chat,humaneval] [--batch-size 32] [--rounds 4]
        [--json OUT.json]

One engine with prefix caching on (as ``hyspec bench`` runs it), the default model; "off" sets the scheduler's
``prefix_block_size`` to None, which leaves the prefix cache as it is and only stops requests from waiting for a
running prefill's pages.  Each pass: the workload's first 8 prompts cycled to ``--batch-size`` requests (the
bench's waves), 48 greedy tokens each, EOS ignored, the prefix cache emptied first.  The order of on and off
alternates every round; the outputs of every pass must be equal.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workloads", default="chat,humaneval")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--json")
    args = ap.parse_args(argv)

    from hyspec import LLM, SamplingParams
    from hyspec.bench.workloads import workload_requests

    llm = LLM(enable_prefix_caching=True)
    tokenizer, scheduler = llm.tokenizer, llm.engine.scheduler
    block_size = scheduler.prefix_block_size
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True)
    results = []
    for workload in [w for w in args.workloads.split(",") if w]:
        requests = workload_requests(workload, tokenizer.apply_chat_template, 8)
        ids = [tokenizer.encode(text, add_special_tokens=not rendered) for text, rendered in requests]
        prompts = [ids[i % len(ids)] for i in range(args.batch_size)]
        llm.generate(prompts, SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))  # warm-up, not timed
        rates: dict[str, list[float]] = {"on": [], "off": []}
        passed_over: dict[str, list[int]] = {"on": [], "off": []}
        reference = None
        for rnd in range(args.rounds):
            for mode in ("on", "off") if rnd % 2 == 0 else ("off", "on"):
                scheduler.prefix_block_size = block_size if mode == "on" else None
                llm.reset_prefix_cache()
                before = scheduler.passed_over
                t0 = time.perf_counter()
                outs = [list(o.outputs[0].token_ids) for o in llm.generate(prompts, params)]
                rates[mode].append(round(sum(map(len, outs)) / (time.perf_counter() - t0), 1))
                passed_over[mode].append(scheduler.passed_over - before)
                reference = reference or outs
                if outs != reference:
                    print(f"{workload}: outputs differ between passes", file=sys.stderr)
                    return 1
        ratio = statistics.median(a / b for a, b in zip(rates["on"], rates["off"]))
        entry = {"workload": workload, "batch_size": args.batch_size, "prompt_tokens": [len(i) for i in ids],
                 "tok_s": rates, "passed_over_per_pass": passed_over, "on_over_off_median": round(ratio, 3)}
        print(json.dumps(entry), flush=True)
        results.append(entry)
    scheduler.prefix_block_size = block_size
    llm.close()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"command": " ".join(sys.argv), "max_tokens": args.max_tokens, "rounds": args.rounds,
                       "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
