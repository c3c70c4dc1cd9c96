import json, sys
from hyspec import LLM, SamplingParams
prompts = ["def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
           "Write a Python function that checks whether a string is a palindrome.",
           "def merge_sort(xs):\n", "import os\n\ndef list_files(path):\n"]
out = {}
for name, cfg in [("ngram_fixed", {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 3,
                                   "controller": {"enabled": False, "profile_at_startup": False}})]:
    llm = LLM(speculative_config=cfg, kv_cache_bytes=256 << 20)
    res = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=48, ignore_eos=True))
    t = llm.engine.spec.metrics.snapshot()["totals"]
    out[name] = {"tokens": [list(r.outputs[0].token_ids) for r in res],
                 "totals": {k: t[k] for k in ("drafts", "draft_tokens", "accepted_tokens")}}
print(json.dumps(out))
