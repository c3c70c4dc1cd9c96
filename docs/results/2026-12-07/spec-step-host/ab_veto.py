"""The hybrid with and without the bandit's veto handling (two engines, each with its own bandit), beside plain,
one process, passes interleaved (order reversed every round); tokens checked against plain.  With a fourth
argument F, the "old" engine is instead the hybrid with bandit_explore_fraction F (veto handling on in both).

    Q=a8 .venv/bin/python docs/results/2026-12-07/spec-step-host/ab_veto.py chat 1 6 [F]     (Q unset: exact path)
"""
import sys, time, statistics, os
from hyspec import LLM, SamplingParams
from hyspec.bench.interleaved_ab import workload_prompts
wl, B, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
kw = {"quantization": os.environ["Q"]} if os.environ.get("Q") else {}
prompts = workload_prompts(wl, max(8, B))
p = SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True)
engines = {"plain": LLM(**kw), "hybrid old": LLM(**kw, speculative_config={"method": "hybrid"}),
           "hybrid new": LLM(**kw, speculative_config={"method": "hybrid"})}
if len(sys.argv) > 4:
    engines["hybrid old"].close()
    engines["hybrid old"] = LLM(**kw, speculative_config={"method": "hybrid", "hybrid": {
        "policy": "bandit", "bandit_explore_fraction": float(sys.argv[4])}})
else:
    pol = engines["hybrid old"].engine.spec.policy
    pol.plan = lambda step: pol.chain.plan(step)  # before: no veto reaches the bandit
times = {n: [] for n in engines}; ref = None; same = True
for rnd in range(rounds + 1):
    for name in (list(engines) if rnd % 2 else list(engines)[::-1]):
        llm = engines[name]
        if llm.engine.spec.enabled: llm.engine.spec.forget_shared_history()
        llm.reset_prefix_cache()
        t = time.perf_counter()
        outs = llm.generate(prompts, [p] * len(prompts)) if B > 1 else [o for q in prompts for o in llm.generate([q], p)]
        dt = time.perf_counter() - t
        ids = [o.outputs[0].token_ids for o in outs]
        if name == "plain": ref = ref or ids
        elif ref is not None: same &= ids == ref
        if rnd: times[name].append(dt)
med = {n: statistics.median(v) for n, v in times.items()}
print(f"{wl} batch {B} {kw.get('quantization', 'exact')}, {rounds} rounds, median s per pass; tokens identical: {same}")
for n, v in med.items(): print(f"  {n:11s} {v:.3f}  x plain {med['plain'] / v:.3f}   passes {' '.join(f'{x:.3f}' for x in times[n])}")
print(f"  new / old speed {med['hybrid old'] / med['hybrid new']:.3f}")
for n in ("hybrid old", "hybrid new"):
    snap = engines[n].engine.spec.dispatcher.bandit.snapshot()
    tot = {}
    for (k, a), c in snap.choices.items(): tot[a] = tot.get(a, 0) + c
    print(f"  {n} choices: {dict(sorted(tot.items(), key=lambda kv: -kv[1]))}")
for llm in engines.values(): llm.close()
