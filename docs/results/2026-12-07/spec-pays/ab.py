"""Plain decoding against suffix decoding before and after two changes, interleaved in one process, at the bench's
settings (8 prompts, 48 greedy tokens, EOS ignored; batch 1 = one request at a time, batch > 1 = one wave of all
eight).  "before" and "after" are the same suffix engine with both changes switched off or on for the pass, so
they share one learned cost model and calibration (two engines' start-up profiles differ enough to move a
comparison by several percent):

* ``drafting value`` (core/policy/draft_value.py): suffix drafts one step in 16 while the time its drafts are
  expected to save falls short of the time drafting takes; "before" drafts every step;
* ``wave drafting`` (SpecDecoder._propose_wave): in a wave, suffix drafts row by row and stops at the first row
  whose missing draft leaves no row on the critical path; "before" drafts every row.

    .venv/bin/python docs/results/2026-12-07/spec-pays/ab.py chat:1 humaneval:1 chat:8 chat:32 [--rounds 6]
"""
import argparse
import statistics
import time

from hyspec import LLM, SamplingParams
from hyspec.bench.interleaved_ab import workload_prompts


def switch(llm: LLM, on: bool) -> LLM:
    """Both changes on (the code as committed) or off (drafting every step, every row of a wave)."""
    spec = llm.engine.spec
    if on:
        spec.controller.__dict__.pop("should_draft", None)
        spec.proposers["suffix"].__dict__.pop("drafts_rows_independently", None)
    else:
        spec.controller.should_draft = lambda method: True
        spec.proposers["suffix"].drafts_rows_independently = False
    return llm


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("rows", nargs="+", help="workload:batch")
    ap.add_argument("--rounds", type=int, default=6)
    args = ap.parse_args()
    params = SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True)
    plain, suffix = LLM(), LLM(speculative_config={"method": "suffix"})
    engines = {"plain": (plain, None), "suffix before": (suffix, False), "suffix after": (suffix, True)}
    for row in args.rows:
        workload, batch = row.split(":")
        batch = int(batch)
        prompts = workload_prompts(workload, 8)

        def one_pass(name: str) -> float:
            llm, on = engines[name]
            if on is not None:
                switch(llm, on)
            if llm.engine.spec.enabled:
                llm.engine.spec.forget_shared_history()
            llm.reset_prefix_cache()
            t = time.perf_counter()
            if batch == 1:
                outs = [o for p in prompts for o in llm.generate([p], params)]
            else:
                outs = [o for i in range(0, len(prompts), batch) for o in llm.generate(prompts[i:i + batch], params)]
            return sum(len(o.outputs[0].token_ids) for o in outs) / (time.perf_counter() - t)

        for name in engines:
            one_pass(name)  # warm-up: the sizer's cells, the cost model
        rates = {name: [] for name in engines}
        totals = {name: {"drafts": 0, "draft_tokens": 0, "accepted_tokens": 0} for name in engines}
        for rnd in range(args.rounds):
            order = list(engines) if rnd % 2 == 0 else list(engines)[::-1]
            for name in order:
                llm = engines[name][0]
                t0 = llm.engine.spec.metrics.snapshot()["totals"] if llm.engine.spec.enabled else None
                rates[name].append(one_pass(name))
                if t0 is not None:
                    t1 = llm.engine.spec.metrics.snapshot()["totals"]
                    for key in totals[name]:
                        totals[name][key] += t1[key] - t0[key]
        print(f"== {workload} batch {batch}, {args.rounds} interleaved rounds, tok/s median (min-max)")
        for name, r in rates.items():
            line = f"{name:14s} {statistics.median(r):7.1f} ({min(r):.1f}-{max(r):.1f})"
            if name != "plain":
                paired = [a / b for a, b in zip(r, rates["plain"])]
                line += f"  vs plain: paired median {statistics.median(paired):.3f}  ratio of medians " \
                        f"{statistics.median(r) / statistics.median(rates['plain']):.3f}"
                t = totals[name]
                line += f"  drafts {t['drafts']} tokens {t['draft_tokens']} accepted {t['accepted_tokens']}"
            print(line, flush=True)
        paired = [a / b for a, b in zip(rates["suffix after"], rates["suffix before"])]
        print(f"after / before: paired median {statistics.median(paired):.3f} "
              f"(min {min(paired):.3f}, max {max(paired):.3f})", flush=True)
    plain.close()
    suffix.close()


if __name__ == "__main__":
    main()
