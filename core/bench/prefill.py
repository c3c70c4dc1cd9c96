"""The prefill figure (``hyspec bench --prefill-tokens N``): one N-token prompt prefilled alone, tokens/s.

The prompt is the run's own prompts' token ids laid end to end (cut at N), so it is real text of the
workload, not a repeated token.  Each timed run empties the prefix cache first and generates one token,
so it measures the whole prompt's forward pass plus one decoding step; the first run is untimed.
hyspec plain, vLLM plain (hyspec.bench.vllm_rows) and llama.cpp plain (with the llama.cpp peers: its worker's
time to the first token of that prompt, from an empty context) measure the same prompt the same way.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Sequence

from hyspec import SamplingParams
from hyspec.bench import hyspec_runs  # through the module, as the runner does
from hyspec.bench.measure import Workload
from hyspec.bench.settings import BenchSettings
from hyspec.bench.stats import Spread


def long_prompt(prompts: Sequence[Sequence[int]], tokens: int) -> list[int]:
    """``tokens`` token ids: the prompts one after another, from the first again if they are too few."""
    if not prompts or not any(prompts):
        raise ValueError("no prompt tokens to build the prefill prompt from")
    out: list[int] = []
    while len(out) < tokens:
        for p in prompts:
            out += list(p)
    return out[:tokens]


def hyspec_prefill(model: Path, settings: BenchSettings, prompt: Sequence[int], repeats: int) -> dict[str, Any]:
    """hyspec plain's prefill speed on ``prompt`` (an engine of its own, closed after)."""
    llm = hyspec_runs.build_llm(model, settings, None)
    try:
        params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
        rates = []
        for i in range(repeats + 1):
            llm.reset_prefix_cache()
            start = time.perf_counter()
            llm.generate([list(prompt)], [params])
            if i:
                rates.append(len(prompt) / (time.perf_counter() - start))
    finally:
        hyspec_runs.close_llm(llm)
    return {"engine": "hyspec", "label": "hyspec plain", "tokens_per_s": Spread.of(rates).to_dict()}


def llamacpp_prefill(peer: Any, prompt: Sequence[int], repeats: int) -> dict[str, Any]:
    """llama.cpp plain's prefill speed on ``prompt``: a :class:`hyspec.bench.llamacpp_peer.LlamaCppPeer` run of
    that one prompt for one token, each repeat from an empty context, timed to its first token."""
    workload = Workload((tuple(int(t) for t in prompt),), 1, 0.0, 1, 0)
    m = peer.run("llamacpp", workload, repeats)
    rates = [len(prompt) / t for t in m.ttft_s.runs if t > 0]
    return {"engine": "llamacpp", "label": "llama.cpp plain", "tokens_per_s": Spread.of(rates).to_dict()}
