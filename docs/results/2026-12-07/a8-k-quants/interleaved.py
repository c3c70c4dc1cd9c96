"""quantization="a8" against the exact path on one GGUF, both engines in one process, passes interleaved (the order
flips every round): batch 1, N prompts x T tokens, EOS ignored, T = 0, prefill included, prefix cache emptied
before each pass.  Prints tok/s per engine and round, the median ratio, and whether both engines' tokens agree.

    .venv/bin/python docs/results/2026-12-07/a8-k-quants/interleaved.py MODEL.gguf WORKLOAD [ROUNDS] [TOKENS]
"""
import statistics
import sys
import time

from hyspec import LLM, SamplingParams
from hyspec.bench.interleaved_ab import workload_prompts

path, workload = sys.argv[1], sys.argv[2]
rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 5
tokens = int(sys.argv[4]) if len(sys.argv) > 4 else 48
prompts = workload_prompts(workload, 8)
params = SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True)
engines = {"exact": LLM(path), "a8": LLM(path, quantization="a8")}
speed = {name: [] for name in engines}
outputs = {}
for r in range(rounds + 1):  # round 0 warms both
    for name in (list(engines) if r % 2 else list(engines)[::-1]):
        llm = engines[name]
        llm.reset_prefix_cache()
        t = time.perf_counter()
        outputs[name] = [llm.generate([p], params)[0].outputs[0].token_ids for p in prompts]
        if r:
            speed[name].append(len(prompts) * tokens / (time.perf_counter() - t))
for name, v in speed.items():
    print(f"{name:6s} tok/s per round: " + " ".join(f"{x:.1f}" for x in v) + f"  median {statistics.median(v):.1f}")
ratios = [a / e for a, e in zip(speed["a8"], speed["exact"])]
print(f"{workload}: a8 / exact per round: " + " ".join(f"{x:.3f}" for x in ratios)
      + f"  median {statistics.median(ratios):.3f}")
same = sum(a == b for x, y in zip(outputs["a8"], outputs["exact"]) for a, b in zip(x, y))
print(f"tokens where a8 and exact agree: {same} of {len(prompts) * tokens}")
for llm in engines.values():
    llm.close()
