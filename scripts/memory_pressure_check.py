"""Drafters under KV memory pressure on the default model: the issue's pressure test, written as JSON.

More long requests than the KV pool holds, with the EAGLE-3 head of assets/ resident: the head is
released (its weights and KV pages), every request completes with plain decoding's tokens, and the
head is back after the cool-down.  RSS and the pool's pages per owner are sampled before, during and
after.

    python scripts/memory_pressure_check.py --out docs/results/2026-12-01/memory_pressure/check.json
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

PROMPTS = ["Write a Python function that parses a CSV file and returns the rows as dictionaries.",
           "Explain how a hash map handles collisions, with an example in Python.",
           "Write a class implementing a stack with push, pop and peek, with docstrings.",
           "Describe the difference between a process and a thread.",
           "Write a function that returns the n-th Fibonacci number iteratively, and test it.",
           "Explain what a Python decorator is and write one that times a function.",
           "Write a binary search over a sorted list and explain its complexity.",
           "Summarise how TCP establishes a connection."]


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--max-tokens", type=int, default=192)
    ap.add_argument("--pool-tokens", type=int, default=1024, help="KV pool size in target tokens")
    ap.add_argument("--cooldown", type=float, default=10.0)
    args = ap.parse_args()
    from hyspec import LLM, SamplingParams
    from hyspec.assets import default_drafter, default_model

    model = default_model()
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True)
    probe = LLM(str(model), kv_cache_bytes=64 << 20, max_model_len=1024)
    kv = probe.engine.pool.page_bytes * (args.pool_tokens // probe.engine.layout.block_size)
    prompts = [probe.tokenizer.encode(probe.tokenizer.apply_chat_template([{"role": "user", "content": p}]),
                                      add_special_tokens=False) for p in PROMPTS]
    plain = [o.outputs[0].token_ids for o in probe.generate([{"prompt_token_ids": p} for p in prompts], params)]
    del probe

    # controller off: the head drafts every step (and holds KV pages) until it is released
    spec_cfg = {"method": "eagle3", "model": str(default_drafter("eagle3")), "num_speculative_tokens": 3,
                "controller": {"enabled": False, "profile_at_startup": False},
                "memory_pressure": {"window_s": 1.0, "cooldown_s": args.cooldown}}
    llm = LLM(str(model), kv_cache_bytes=kv, max_model_len=1024, speculative_config=spec_cfg)
    engine, spec = llm.engine, llm.engine.spec
    pool = engine.pool
    head = spec.proposers["eagle3"].head
    shared = {t.data_ptr() for t in engine.model.parameters()}  # the target's embedding / lm_head it reads
    head_bytes = sum(t.numel() * t.element_size() for t in [*head.parameters(), *head.buffers()]
                     if t.data_ptr() not in shared)
    report = {"model": str(model), "drafter_tensor_mb": round(head_bytes / 2**20, 1), "pool_pages": pool.num_pages, "block_size": engine.layout.block_size,
              "requests": len(prompts), "max_tokens": args.max_tokens, "memory_pressure": spec_cfg["memory_pressure"],
              "before": {"rss_mb": rss_mb(), "pages": pool.pages_by_owner(), **spec.metrics.ops.snapshot()}}
    ids = [engine.add_request({"prompt_token_ids": p}, params).request_id for p in prompts]
    outs, samples, released_at = {}, [], None
    t0 = time.perf_counter()
    while engine.has_unfinished_requests():
        for o in engine.step():
            if o.finished:
                outs[o.request_id] = o.outputs[0].token_ids
        resident = "eagle3" in spec.proposers
        if not resident and released_at is None:
            released_at = time.perf_counter() - t0
            report["at_release"] = {"seconds": round(released_at, 2), "rss_mb": rss_mb(),
                                    "pages": pool.pages_by_owner()}
        if resident or len(samples) % 4 == 0:
            samples.append({"t": round(time.perf_counter() - t0, 2), "resident": resident,
                            "pages": pool.pages_by_owner(), "rss_mb": round(rss_mb(), 1)})
    report["run_seconds"] = round(time.perf_counter() - t0, 2)
    report["samples"] = samples[::max(1, len(samples) // 40)]
    report["identical_to_plain"] = [outs[i] for i in ids] == plain
    pool.check_invariants()
    report["after"] = {"rss_mb": rss_mb(), "pages": pool.pages_by_owner(), **spec.metrics.ops.snapshot()}
    time.sleep(args.cooldown + 0.5)
    again = llm.generate([{"prompt_token_ids": prompts[0]}], params)[0].outputs[0].token_ids
    report["after_cooldown"] = {"rss_mb": rss_mb(), "identical_to_plain": again == plain[0],
                                "pages": pool.pages_by_owner(), **spec.metrics.ops.snapshot(),
                                "memory_pressure_rejections": spec.metrics.snapshot()["totals"]["rejections"].get(
                                    "memory_pressure", 0)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps({k: v for k, v in report.items() if k != "samples"}, indent=1))
    return 0 if report["identical_to_plain"] and report["after_cooldown"]["identical_to_plain"] else 1


if __name__ == "__main__":
    sys.exit(main())
