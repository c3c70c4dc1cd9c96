"""Same-engine A/B of the greedy argmax: torch's (before) against numpy's (after, core/ops/sampling.py greedy),
switched per pass on one engine per configuration, passes interleaved; tokens compared.

    .venv/bin/python docs/results/2026-12-07/greedy-argmax/ab.py [ROUNDS]
"""
import statistics, sys, time
import torch
from hyspec import LLM, SamplingParams
from hyspec.bench.interleaved_ab import workload_prompts
from hyspec.ops import sampling
from hyspec.engine import sampler
from hyspec.spec import verify_greedy

ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 6
after = sampling.greedy
def before(logits):
    return sampling.guard_logits(logits).argmax(dim=-1)
def use(f):
    sampler.greedy = verify_greedy.greedy = sampling.greedy = f

p = SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True)
for method in (None, "suffix"):
    llm = LLM(speculative_config={"method": method} if method else None)
    for workload, batch in (("chat", 1), ("humaneval", 1), ("chat", 8), ("chat", 32)):
        prompts = workload_prompts(workload, 32 if batch == 32 else 8)
        def run():
            if llm.engine.spec.enabled:
                llm.engine.spec.forget_shared_history()
            llm.reset_prefix_cache()
            t = time.perf_counter()
            outs = ([llm.generate([q], p)[0] for q in prompts] if batch == 1 else llm.generate(prompts, [p] * len(prompts)))
            return time.perf_counter() - t, [list(o.outputs[0].token_ids) for o in outs]
        use(after); run()  # warm-up
        ratios, tokens = [], {}
        for r in range(ROUNDS):
            times = {}
            for name, f in (("before", before), ("after", after)) if r % 2 == 0 else (("after", after), ("before", before)):
                use(f)
                times[name], tokens[name] = run()
            ratios.append(times["before"] / times["after"])
        print(f"{method or 'plain':6s} {workload:9s} batch {batch:2d}: after / before speed, median of {ROUNDS} paired "
              f"rounds {statistics.median(ratios):.3f} (min {min(ratios):.3f}, max {max(ratios):.3f}); "
              f"tokens identical: {tokens['before'] == tokens['after']}", flush=True)
    llm.close()
use(after)
