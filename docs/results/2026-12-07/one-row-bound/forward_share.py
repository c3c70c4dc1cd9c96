"""How much of a batch-1 plain decoding run is the target forward: HumanEval, 8 prompts x 48 tokens, EOS ignored,
prefix cache reset per round, one warm round then ROUNDS timed ones.

    .venv/bin/python docs/results/2026-12-07/one-row-bound/forward_share.py [ROUNDS]
"""
import sys
import time

from hyspec import LLM, SamplingParams
from hyspec.bench.interleaved_ab import workload_prompts
from hyspec.seam.forward import ModelRunner

rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 4
forward = [0.0]
run = ModelRunner.run


def timed_run(self, *args, **kwargs):
    t = time.perf_counter()
    try:
        return run(self, *args, **kwargs)
    finally:
        forward[0] += time.perf_counter() - t


ModelRunner.run = timed_run
prompts = workload_prompts("humaneval", 8)
params = SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True)
llm = LLM()
wall = 0.0
for r in range(rounds + 1):
    llm.reset_prefix_cache()
    t = time.perf_counter()
    for prompt in prompts:
        llm.generate([prompt], params)
    if r == 0:
        forward[0] = 0.0
    else:
        wall += time.perf_counter() - t
print(f"{rounds} rounds: wall {wall:.2f} s, target forward {forward[0]:.2f} s ({forward[0] / wall:.1%})")
llm.close()
