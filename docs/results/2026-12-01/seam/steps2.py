import json, sys, time, statistics
from hyspec import LLM, SamplingParams
llm = LLM(kv_cache_bytes=256 << 20)
e = llm.engine
acc = [0.0]
real = e.runner.run
def timed(*a, **k):
    t0 = time.perf_counter(); r = real(*a, **k); acc[0] += time.perf_counter() - t0; return r
e.runner.run = timed
prompt = "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"
llm.generate([prompt], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
over, fwd = [], []
for rep in range(4):
    e.add_request(prompt, SamplingParams(temperature=0, max_tokens=64, ignore_eos=True))
    while e.has_unfinished_requests():
        acc[0] = 0.0
        t0 = time.perf_counter(); e.step(); dt = time.perf_counter() - t0
        over.append(dt - acc[0]); fwd.append(acc[0])
print(json.dumps({"overhead_ms": round(statistics.median(over) * 1e3, 3), "forward_ms": round(statistics.median(fwd) * 1e3, 2)}))
