"""Profile plain decode steps of the default model: torch.profiler op table per decode token + wall tok/s."""
import sys, time, torch
torch.set_num_threads(2)
from hyspec import LLM, SamplingParams
q = None if sys.argv[1] == "default" else sys.argv[1]
llm = LLM(quantization=q, max_model_len=1024)
N = 64
p = SamplingParams(max_tokens=N, temperature=0, ignore_eos=True)
msgs = [{"role": "user", "content": "Write a Python function that checks whether a number is prime."}]
llm.chat(msgs, SamplingParams(max_tokens=8, temperature=0))
t = time.perf_counter(); llm.chat(msgs, p); dt = time.perf_counter() - t
print(f"quantization={q}: {N / dt:.1f} tok/s wall ({dt / N * 1e3:.1f} ms per token incl. prefill)")
from torch.profiler import ProfilerActivity, profile
with profile(activities=[ProfilerActivity.CPU]) as prof:
    llm.chat(msgs, p)
total = sum(e.self_cpu_time_total for e in prof.key_averages())
print(f"ops self CPU per token: {total / N / 1e3:.2f} ms (the rest of the wall time is Python)")
for e in sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:14]:
    print(f"  {e.key:<52} {e.self_cpu_time_total / N / 1e3:7.3f} ms/token  {e.count / N:6.1f} calls/token")
