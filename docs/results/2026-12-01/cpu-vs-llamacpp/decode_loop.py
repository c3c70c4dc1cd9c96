import time, torch
torch.set_num_threads(2)
from hyspec import LLM, SamplingParams
llm = LLM(max_model_len=1024)
msgs = [{"role": "user", "content": "Write a Python function that checks whether a number is prime."}]
p = SamplingParams(max_tokens=200, temperature=0, ignore_eos=True)
llm.chat(msgs, SamplingParams(max_tokens=8, temperature=0))
t = time.perf_counter(); llm.chat(msgs, p); print(200 / (time.perf_counter() - t), "tok/s")
