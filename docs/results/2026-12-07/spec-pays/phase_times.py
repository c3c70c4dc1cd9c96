"""Milliseconds each engine phase takes over 4 passes (after a warm-up pass) of 8 prompts x 48 greedy tokens,
plain against suffix (a third argument names another method; "plain" runs two more plain engines instead: the
engine-to-engine noise), one process, passes interleaved.  Wraps the engine's methods with wall-clock timers; the
speculative engine's line is labelled "suffix" whatever its method.

    .venv/bin/python docs/results/2026-12-07/spec-pays/phase_times.py chat 8 [plain | hybrid | ...]
"""
import time, statistics, sys, collections
from hyspec import LLM, SamplingParams
from hyspec.bench.interleaved_ab import workload_prompts
from hyspec.engine import engine as eng
from hyspec.spec import decoder as dec
wl = sys.argv[1] if len(sys.argv) > 1 else "chat"
B = int(sys.argv[2]) if len(sys.argv) > 2 else 1
prompts = workload_prompts(wl, 8)
p = SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True)
acc = collections.defaultdict(float); cur = ["x"]; steps = collections.Counter()
def wrap(cls, name):
    f = getattr(cls, name)
    def w(*a, **k):
        t = time.perf_counter(); r = f(*a, **k); acc[(cur[0], name)] += time.perf_counter() - t; return r
    setattr(cls, name, w)
for n in ["step", "_forward", "_accept", "_emit_step"]: wrap(eng.LLMEngine, n)
for n in ["plan", "draft", "observe", "accept"]: wrap(dec.SpecDecoder, n)
from hyspec.spec import strategy as strat
from hyspec.drafters.suffix import proposer as sp
from hyspec.policy import controller as ctl
from hyspec.ops import sampling as smp
for n in ["propose", "draft", "_tree", "_own_store"]: wrap(sp.SuffixProposer, n)
for n in ["size_scored", "observe_draft_time"]: wrap(ctl.GoodputController, n)
wrap(smp.SamplingTensors, "from_params")
for n in ["_check_tree", "cut_forbidden_drafts"]:
    f = getattr(dec, n)
    def mk(f, n):
        def w(*a, **k):
            t = time.perf_counter(); r = f(*a, **k); acc[(cur[0], n)] += time.perf_counter() - t; return r
        return w
    setattr(dec, n, mk(f, n))
for n in ["_propose", "_wave_remaining", "_is_wave"]: wrap(dec.SpecDecoder, n)
for n in ["schedule"]: wrap(__import__("hyspec.engine.scheduler", fromlist=["x"]).Scheduler, n)
from hyspec.seam import forward as fw
wrap(fw.ModelRunner, "run")
from hyspec.policy import chain

engines = ({"plain": LLM(), "plain 2": LLM(), "plain 3": LLM()} if sys.argv[3:] == ["plain"] else
           {"plain": LLM(), "suffix": LLM(speculative_config={"method": (sys.argv[3:] or ["suffix"])[0]})})
ostep = eng.LLMEngine.step
for rnd in range(5):
    for name, llm in engines.items():
        cur[0] = name if rnd else "warm"
        if llm.engine.spec.enabled: llm.engine.spec.forget_shared_history()
        llm.reset_prefix_cache()
        t=time.perf_counter()
        llm.generate(prompts, [p]*8) if B > 1 else [llm.generate([q], p) for q in prompts]
        acc[(cur[0], "wall")] += time.perf_counter()-t
for name in engines:
    print(name, {k: round(1e3 * v, 1) for (e, k), v in acc.items() if e == name})
for llm in engines.values(): llm.close()
