"""Where a step's time goes for plain decoding, the hybrid and suffix alone, at batch 1: the target forward against
the rest of the step, and the rest split into the speculative decoder's plan / draft / accept / observe and the
engine's emit. Three engines in one process, passes interleaved (order reversed every round), after one warm round.

    .venv/bin/python docs/results/2026-12-07/spec-step-host/hybrid_host_split.py chat 3
"""
import sys
import time
from collections import defaultdict

from hyspec import LLM, SamplingParams
from hyspec.bench.interleaved_ab import workload_prompts
from hyspec.engine.engine import LLMEngine
from hyspec.spec.decoder import SpecDecoder

workload = sys.argv[1] if len(sys.argv) > 1 else "chat"
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
prompts = workload_prompts(workload, 8)
params = SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True)
spent = defaultdict(lambda: defaultdict(float))
current = [None]


def timed(cls, name):
    original = getattr(cls, name)

    def wrapper(self, *args, **kwargs):
        t = time.perf_counter()
        result = original(self, *args, **kwargs)
        spent[current[0]][name] += time.perf_counter() - t
        if name == "step":
            spent[current[0]]["steps"] += 1
        return result

    setattr(cls, name, wrapper)


for name in ("step", "_forward", "_emit_step"):
    timed(LLMEngine, name)
for name in ("plan", "draft", "accept", "observe"):
    timed(SpecDecoder, name)

engines = {"plain": LLM(), "hybrid": LLM(speculative_config={"method": "hybrid"}),
           "suffix": LLM(speculative_config={"method": "suffix"})}
for rnd in range(rounds + 1):
    for name in (list(engines) if rnd % 2 else list(engines)[::-1]):
        current[0] = name if rnd else "warm"
        llm = engines[name]
        if llm.engine.spec.enabled:
            llm.engine.spec.forget_shared_history()
        llm.reset_prefix_cache()
        for prompt in prompts:
            llm.generate([prompt], params)
tokens = rounds * len(prompts) * params.max_tokens
print(f"{workload}, batch 1, {rounds} rounds of {len(prompts)} prompts x {params.max_tokens} tokens")
for name in engines:
    s = spent[name]
    steps = s["steps"]
    print(f"{name:7s} ms/token {1e3 * s['step'] / tokens:.3f}  tokens/step {tokens / steps:.3f}  "
          f"forward ms/step {1e3 * s['_forward'] / steps:.3f}  rest ms/step {1e3 * (s['step'] - s['_forward']) / steps:.3f}")
    print("        us/step " + "  ".join(f"{k} {1e6 * s[k] / steps:.0f}"
                                        for k in ("plan", "draft", "accept", "observe", "_emit_step")))
for llm in engines.values():
    llm.close()
