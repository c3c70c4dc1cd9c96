"""Greedy decoding of the default model on one chat prompt: N tokens (argv[1]) after a warm-up, wall tok/s."""
import sys
import time

import torch

torch.set_num_threads(2)
from hyspec import LLM, SamplingParams  # noqa: E402

n = int(sys.argv[1]) if len(sys.argv) > 1 else 256
llm = LLM(max_model_len=1024)
msgs = [{"role": "user", "content": "Write a Python function that checks whether a number is prime."}]
llm.chat(msgs, SamplingParams(max_tokens=8, temperature=0))
t = time.perf_counter()
llm.chat(msgs, SamplingParams(max_tokens=n, temperature=0, ignore_eos=True))
print(f"{n / (time.perf_counter() - t):.1f} tok/s ({n} tokens, prefill included)")
