"""Plain against suffix at batch 8 on chat, interleaved in one process: where a suffix step spends its time when it
verifies nothing.  Wraps ModelRunner.run to split each engine's wall time into the forward pass and the rest (host work:
planning, drafting, sampling, bookkeeping).

    .venv/bin/python docs/results/2026-12-07/spec-cost-batch-zen4/host_ab.py
"""
import time, statistics
from hyspec import LLM, SamplingParams
from hyspec.bench.interleaved_ab import workload_prompts
from hyspec.seam import forward as fw
prompts = workload_prompts("chat", 8)
p = SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True)
stats = {}
orig = fw.ModelRunner.run
cur = [None]
def run(self, feeds, *a, **k):
    t = time.perf_counter(); out = orig(self, feeds, *a, **k)
    if cur[0] is None: return out
    s = stats[cur[0]]; s["fwd"] += time.perf_counter() - t; s["steps"] += 1
    s["rows"] += sum(len(f.tokens) for f in feeds)
    return out
fw.ModelRunner.run = run
engines = {"plain": LLM(), "suffix": LLM(speculative_config={"method": "suffix"})}
for name, llm in engines.items():  # warm-up
    cur[0] = name; stats[name] = {"fwd": 0.0, "steps": 0, "rows": 0, "wall": 0.0}
    llm.generate(prompts, [p] * 8)
rates = {n: [] for n in engines}
for rnd in range(6):
    for name in (list(engines) if rnd % 2 == 0 else list(engines)[::-1]):
        llm = engines[name]; cur[0] = name
        if llm.engine.spec.enabled: llm.engine.spec.forget_shared_history()
        llm.reset_prefix_cache()
        if rnd == 0: stats[name] = {"fwd": 0.0, "steps": 0, "rows": 0, "wall": 0.0}
        t = time.perf_counter(); out = llm.generate(prompts, [p] * 8); dt = time.perf_counter() - t
        stats[name]["wall"] += dt
        rates[name].append(sum(len(o.outputs[0].token_ids) for o in out) / dt)
for n in engines:
    s = stats[n]
    print(n, "median tok/s", round(statistics.median(rates[n]), 1), "steps", s["steps"], "rows", s["rows"],
          "fwd s", round(s["fwd"], 2), "wall s", round(s["wall"], 2), "fwd ms/step", round(1e3 * s["fwd"] / s["steps"], 2),
          "non-fwd ms/step", round(1e3 * (s["wall"] - s["fwd"]) / s["steps"], 2))
print("paired", [round(a / b, 3) for a, b in zip(rates["suffix"], rates["plain"])])
print("drafts", engines["suffix"].engine.spec.metrics.snapshot()["totals"])
for llm in engines.values(): llm.close()
