"""Where the hybrid's steps that draft nothing spend their time, against a plain engine's: microseconds per step of
each engine phase, over decode steps whose forward took one row a sequence (the plain engine's, and the hybrid's
steps the bandit sent to "none"), chat at batch 1, passes of 8 prompts x 48 greedy tokens interleaved in one
process (a warm-up pass first).  Also the hybrid's steps per chosen arm.

    .venv/bin/python docs/results/2026-12-07/spec-pays/hybrid_host.py [PASSES]
"""
import collections, sys, time
from hyspec import LLM, SamplingParams
from hyspec.bench.interleaved_ab import workload_prompts
from hyspec.engine import engine as eng
from hyspec.policy import dispatcher as dsp
from hyspec.seam import forward as fw
from hyspec.spec import decoder as dec

PASSES = int(sys.argv[1]) if len(sys.argv) > 1 else 6
prompts = workload_prompts("chat", 8)
p = SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True)
cur, arm = ["warm"], [None]
phase = collections.Counter()  # this step's seconds per phase
per_step = collections.defaultdict(collections.Counter)  # engine -> phase -> seconds over the counted steps
counted, arms = collections.Counter(), collections.Counter()


def timed(cls, name):
    f = getattr(cls, name)
    def wrapper(*a, **k):
        t = time.perf_counter(); r = f(*a, **k); phase[name] += time.perf_counter() - t; return r
    setattr(cls, name, wrapper)


for name in ("_accept", "_emit_step"): timed(eng.LLMEngine, name)
for name in ("plan", "draft", "observe", "accept"): timed(dec.SpecDecoder, name)
for name in ("choose", "observe_step"): timed(dsp.HybridDispatcher, name)
timed(fw.ModelRunner, "run")
choose = dsp.HybridDispatcher.choose
def remember(self, signals):
    arm[0] = choose(self, signals); return arm[0]
dsp.HybridDispatcher.choose = remember
step = eng.LLMEngine.step
def counted_step(self, *a, **k):
    arm[0] = None; phase.clear()
    t = time.perf_counter(); r = step(self, *a, **k); seconds = time.perf_counter() - t
    if cur[0] != "warm":
        arms[(cur[0], arm[0])] += 1
        decode_only = all(not s.in_prefill for s in self.scheduler.running)
        if arm[0] in (None, "none") and decode_only and phase["run"] < 0.03:  # a one-row-per-sequence forward
            counted[cur[0]] += 1
            per_step[cur[0]]["step"] += seconds
            for k2, v in phase.items(): per_step[cur[0]][k2] += v
    return r
eng.LLMEngine.step = counted_step

engines = {"plain": LLM(), "hybrid": LLM(speculative_config={"method": "hybrid"})}
wall = collections.Counter()
for rnd in range(PASSES + 1):
    for name, llm in (engines.items() if rnd % 2 else reversed(engines.items())):
        if llm.engine.spec.enabled: llm.engine.spec.forget_shared_history()
        llm.reset_prefix_cache(); cur[0] = name if rnd else "warm"
        t = time.perf_counter()
        for q in prompts: llm.generate([q], p)
        if rnd: wall[name] += time.perf_counter() - t
print(f"{PASSES} passes, wall s: " + ", ".join(f"{k} {v:.3f}" for k, v in wall.items())
      + f"; hybrid / plain speed {wall['plain'] / wall['hybrid']:.3f}")
for name in engines:
    n = counted[name]
    print(f"{name}: {n} steps that drafted nothing; us per step: "
          + ", ".join(f"{k} {1e6 * v / n:.1f}" for k, v in sorted(per_step[name].items())))
print("hybrid steps per arm (None: a step the dispatcher did not decide, e.g. a prefill): "
      + ", ".join(f"{a} {n}" for (e, a), n in sorted(arms.items(), key=lambda kv: -kv[1]) if e == "hybrid"))
for llm in engines.values(): llm.close()
