import json, sys, time
from hyspec import LLM, SamplingParams
prompt = "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"
spec = None if sys.argv[1] == "plain" else {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1,
        "prompt_lookup_max": 3, "controller": {"enabled": False, "profile_at_startup": False}}
llm = LLM(speculative_config=spec, kv_cache_bytes=256 << 20)
p = SamplingParams(temperature=0, max_tokens=64, ignore_eos=True)
llm.generate([prompt], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
rates = []
for _ in range(3):
    t0 = time.perf_counter(); out = llm.generate([prompt], p); dt = time.perf_counter() - t0
    rates.append(64 / dt)
print(json.dumps({"mode": sys.argv[1], "rates": rates}))
