"""One prompt's decode on a GGUF with quantization="a8": the time of 1 token and of N (N - 1 decode steps apart).
Profiled with py-spy (its own venv: `py-spy record --native -f raw -o OUT -- python decode_step.py FILE 256`).

    .venv/bin/python docs/results/2026-12-07/a8-compact-layout/decode_step.py MODEL.gguf [N]
"""
import sys
import time

from hyspec import LLM, SamplingParams

path, n = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 64
llm = LLM(path, quantization="a8")
llm.generate(["def f(x):"], SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))  # warm
took = {}
for tokens in (1, n):
    llm.reset_prefix_cache()
    t = time.perf_counter()
    llm.generate(["def f(x):"], SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True))
    took[tokens] = time.perf_counter() - t
print(f"1 token {took[1] * 1e3:.1f} ms, {n} tokens {took[n] * 1e3:.1f} ms: "
      f"{(took[n] - took[1]) / (n - 1) * 1e3:.1f} ms a decode step")
