"""The llama.cpp peer's worker: run by a Python that has llama-cpp-python, never imported by hyspec.

``hyspec bench`` starts it as ``PYTHON llamacpp_worker.py`` (llama-cpp-python
usually lives in its own venv: it compiles llama.cpp from source) and writes
one JSON job to its stdin; it answers one JSON document on stdout.  It needs
only the standard library and ``llama_cpp``.

Job: ``model`` (the GGUF), ``threads``, ``n_ctx``, ``mode`` (``plain`` or
``prompt_lookup``), ``num_pred_tokens`` and ``max_ngram_size`` (prompt
lookup), ``prompts`` (token id lists, run one at a time: batch size 1),
``max_tokens``, ``repeats``, ``warmup_tokens``.

Each prompt starts from an empty context (``reset``: no KV reuse between
prompts or repeats, as hyspec's runs get none), decodes greedily (top-k 1,
no repeat penalty) and generates exactly ``max_tokens`` tokens: the end of
sequence token does not stop it, as it does not stop the other engines in
the bench.  Per repeat the answer holds the outputs, the wall seconds of all
prompts together and each prompt's time to first token.
"""
from __future__ import annotations

import json
import resource
import sys
import time


def _generate(llm, prompt: list[int], max_tokens: int) -> tuple[list[int], float]:
    llm.reset()
    out: list[int] = []
    start = time.perf_counter()
    first = 0.0
    for token in llm.generate(prompt, top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0, reset=True):
        if not out:
            first = time.perf_counter() - start
        out.append(int(token))
        if len(out) >= max_tokens:
            break
    return out, first


def _peak_rss_bytes() -> int:
    """This process's resident high-water mark.  VmHWM, not getrusage: ru_maxrss survives exec, so a child
    started by a large parent would report the parent's peak."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def main() -> int:
    job = json.load(sys.stdin)
    import llama_cpp

    draft = None
    if job["mode"] == "prompt_lookup":
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

        draft = LlamaPromptLookupDecoding(num_pred_tokens=job["num_pred_tokens"],
                                          max_ngram_size=job["max_ngram_size"])
    elif job["mode"] != "plain":
        raise SystemExit(f"unknown mode {job['mode']!r}")
    llm = llama_cpp.Llama(model_path=job["model"], n_ctx=job["n_ctx"], n_batch=512, n_threads=job["threads"],
                          n_threads_batch=job["threads"], draft_model=draft, verbose=False, seed=0)
    prompts = job["prompts"]
    _generate(llm, prompts[0], job["warmup_tokens"])  # untimed: first-call allocations, page faults
    repeats = []
    for _ in range(job["repeats"]):
        outputs, ttfts = [], []
        start = time.perf_counter()
        for prompt in prompts:
            tokens, first = _generate(llm, prompt, job["max_tokens"])
            outputs.append(tokens)
            ttfts.append(first)
        repeats.append({"seconds": time.perf_counter() - start, "outputs": outputs, "ttfts": ttfts})
    info = {"version": getattr(llama_cpp, "__version__", None),
            "system_info": llama_cpp.llama_print_system_info().decode(errors="replace").strip()}
    json.dump({"repeats": repeats, "info": info, "max_rss_bytes": _peak_rss_bytes()}, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
