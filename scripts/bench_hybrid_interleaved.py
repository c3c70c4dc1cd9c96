"""Plain decoding vs the bandit hybrid, interleaved wave by wave in one process, at several batch sizes.

`hyspec bench` measures each configuration in its own block of time, one after the other; on a
shared VM whose speed drifts by 10-20 % over minutes (measured: the same plain run at batch 16 gave
138.6-149.4 tok/s back to back), a ratio between two blocks measured twenty minutes apart says as
much about the drift as about the methods.  Here both engines stay loaded and alternate: a wave of
``batch size`` requests on plain, the same wave on the hybrid, the next wave on plain, ...  Each
round is every wave once on each; the ratio is taken per round and the median reported.

The hybrid is ``hyspec bench``'s: the bandit policy over ngram and suffix (and every drafter in
assets/, as the bench's; --without-drafters for ngram and suffix alone).  The suffix cache is emptied before each round (as the bench does
between passes), the bandit keeps what it learnt, as it would in a server.  At temperature 0 every
hybrid output is compared with plain's.

    .venv/bin/python scripts/bench_hybrid_interleaved.py --workload mixed --batch-sizes 1,4,16,32 \\
        --num-prompts 32 --max-tokens 64 --rounds 3 --out docs/results/2026-12-02/suffix/hybrid-interleaved.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path


def main() -> None:
    from hyspec import LLM, SamplingParams
    from hyspec.assets import default_model
    from hyspec.bench.hyspec_runs import speculative_config
    from hyspec.bench.runner import resolve_drafters
    from hyspec.bench.settings import BenchSettings
    from hyspec.bench.workloads import workload_requests
    from hyspec.model.tokenizer import Tokenizer

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", default="mixed")
    ap.add_argument("--batch-sizes", default="1,4,16,32")
    ap.add_argument("--num-prompts", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--without-drafters", action="store_true",
                    help="the hybrid chooses among ngram and suffix only (default: and the drafters in assets/, as the bench)")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()

    settings = BenchSettings(workload=args.workload, num_prompts=args.num_prompts, max_tokens=args.max_tokens)
    drafters = {} if args.without_drafters else resolve_drafters(settings, True)[0]
    spec = speculative_config("hybrid", settings, drafters)
    tokenizer = Tokenizer(default_model())
    reqs = workload_requests(args.workload, tokenizer.apply_chat_template, args.num_prompts)
    prompts = [tokenizer.encode(text, add_special_tokens=not templated) for text, templated in reqs]
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True)
    plain, hybrid = LLM(), LLM(speculative_config=spec)
    warm = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    for llm in (plain, hybrid):
        llm.generate(prompts[:4], warm, use_tqdm=False)

    def timed(llm, wave):
        t0 = time.perf_counter()
        outs = llm.generate(wave, params, use_tqdm=False)
        return time.perf_counter() - t0, [list(o.outputs[0].token_ids) for o in outs]

    rows, mismatches = [], 0
    for bs in [int(b) for b in args.batch_sizes.split(",")]:
        waves = [prompts[i:i + bs] for i in range(0, len(prompts) // bs * bs, bs)]  # whole waves
        if not waves:
            raise SystemExit(f"--batch-sizes {bs}: more than --num-prompts {len(prompts)}")
        ratios, plain_rates, hybrid_rates = [], [], []
        for _ in range(args.rounds):
            hybrid.engine.spec.forget_shared_history()
            seconds = {"plain": 0.0, "hybrid": 0.0}
            tokens = 0
            for wave in waves:
                dt_p, out_p = timed(plain, wave)
                dt_h, out_h = timed(hybrid, wave)
                seconds["plain"] += dt_p
                seconds["hybrid"] += dt_h
                tokens += sum(len(o) for o in out_p)
                mismatches += sum(a != b for a, b in zip(out_p, out_h))
            plain_rates.append(tokens / seconds["plain"])
            hybrid_rates.append(tokens / seconds["hybrid"])
            ratios.append(plain_rates[-1] and hybrid_rates[-1] / plain_rates[-1])
        row = {"batch_size": bs, "plain_tok_s": [round(r, 1) for r in plain_rates],
               "hybrid_tok_s": [round(r, 1) for r in hybrid_rates], "ratio": [round(r, 3) for r in ratios],
               "median_ratio": round(statistics.median(ratios), 3)}
        rows.append(row)
        print(f"bs {bs:>2}: plain {row['plain_tok_s']} hybrid {row['hybrid_tok_s']} ratio {row['ratio']} "
              f"median {row['median_ratio']}", flush=True)
    snap = hybrid.engine.spec.dispatcher.snapshot()
    result = {"workload": args.workload, "num_prompts": args.num_prompts, "max_tokens": args.max_tokens,
              "rounds": args.rounds, "speculative_config": spec, "rows": rows,
              "hybrid_outputs_differing_from_plain": mismatches,
              "hybrid_decisions": dict(snap.decisions),
              "bandit_choices": {f"{k} {a}": n for (k, a), n in sorted(snap.bandit.choices.items())}}
    print(json.dumps({k: result[k] for k in ("hybrid_outputs_differing_from_plain", "hybrid_decisions")}))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    plain.close()
    hybrid.close()


if __name__ == "__main__":
    main()
