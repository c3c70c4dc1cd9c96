"""llama.cpp as a peer in ``hyspec bench``: the tool people pick to run a GGUF on a CPU.

Through llama-cpp-python, which compiles llama.cpp from source (~15 minutes
on 2 cores), so it is never part of hyspec's own set-up.  It usually lives in
a separate venv: ``--llamacpp-python PATH`` (or ``$HYSPEC_LLAMACPP_PYTHON``)
names that venv's Python; without either, the bench's own interpreter is
tried.  The peer runs in a child process (llamacpp_worker.py) on the same
GGUF file, the same prompt token ids, the same token count and thread count:

* ``llamacpp``: plain greedy decoding;
* ``llamacpp_prompt_lookup``: its prompt-lookup speculation
  (``LlamaPromptLookupDecoding``, ``num_pred_tokens`` = hyspec's
  ``num_speculative_tokens``, n-grams up to 3 tokens as hyspec's ngram).

Batch size 1 and temperature 0 only (llama-cpp-python's ``Llama`` decodes one
sequence; its sampling chain is not the target distribution hyspec's
contract speaks of).  Anything else, a missing or broken install, a model
that is not a GGUF: the column says why.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from hyspec.bench.machine import MemoryPeak
from hyspec.bench.measure import WARMUP_TOKENS, Measurement, Workload
from hyspec.bench.peers import PeerUnavailable
from hyspec.bench.stats import Spread

LLAMACPP_PEERS = ("llamacpp", "llamacpp_prompt_lookup")
PYTHON_ENV = "HYSPEC_LLAMACPP_PYTHON"
INSTALL_HINT = ("pip install llama-cpp-python (it compiles llama.cpp: ~15 min on 2 cores; a separate venv is "
                "best), then pass --llamacpp-python /path/to/that/venv/bin/python")
_WORKER = Path(__file__).with_name("llamacpp_worker.py")
_MODES = {"llamacpp": "plain", "llamacpp_prompt_lookup": "prompt_lookup"}


def resolve_python(explicit: str | None) -> str:
    return explicit or os.environ.get(PYTHON_ENV) or sys.executable


def llamacpp_missing(python: str, timeout_s: float = 120.0) -> tuple[str | None, str | None]:
    """(None, version) when ``python`` imports llama_cpp, else (the reason, None)."""
    if not Path(python).exists():
        return f"no Python at {python} ({INSTALL_HINT})", None
    try:
        done = subprocess.run([python, "-c", "import llama_cpp; print(llama_cpp.__version__)"],
                              capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{python} cannot be run: {type(exc).__name__}: {exc}", None
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["(no message)"])[-1]
        if "No module named 'llama_cpp'" in last:
            return f"llama-cpp-python is not installed for {python} ({INSTALL_HINT})", None
        return f"llama_cpp fails to import in {python}: {last}", None
    return None, done.stdout.strip()


class LlamaCppPeer:
    """One child process per configuration (the model loads in under a second; nothing is shared)."""

    def __init__(self, python: str, model: Path, threads: int, num_speculative_tokens: int, n_ctx: int):
        if model.suffix.lower() != ".gguf":
            raise PeerUnavailable(f"llama.cpp reads GGUF files; {model.name} is not one")
        self.python, self.model, self.threads = python, model, threads
        self.num_speculative_tokens, self.n_ctx = num_speculative_tokens, n_ctx
        self.info: dict | None = None

    @staticmethod
    def unsupported(workload: Workload) -> str | None:
        if workload.batch_size != 1:
            return "llama-cpp-python's Llama decodes one sequence at a time (batch size 1 only)"
        if workload.temperature:
            return "the llama.cpp peer runs greedy decoding only"
        return None

    def run(self, peer: str, workload: Workload, repeats: int, timeout_s: float = 3600.0) -> Measurement:
        reason = self.unsupported(workload)
        if reason is not None:
            raise PeerUnavailable(reason)
        prompts = [list(map(int, workload.prompts[i])) for wave in workload.waves for i in wave]
        job = {"model": str(self.model), "threads": self.threads, "n_ctx": self.n_ctx, "mode": _MODES[peer],
               "num_pred_tokens": self.num_speculative_tokens, "max_ngram_size": 3, "prompts": prompts,
               "max_tokens": workload.max_tokens, "repeats": repeats,
               "warmup_tokens": min(WARMUP_TOKENS, workload.max_tokens)}
        env = dict(os.environ, OMP_NUM_THREADS=str(self.threads))
        done = subprocess.run([self.python, str(_WORKER)], input=json.dumps(job), capture_output=True, text=True,
                              timeout=timeout_s, env=env)
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["(no message)"])[-1]
            raise RuntimeError(f"llama.cpp worker exited with status {done.returncode}: {last}")
        answer = json.loads(done.stdout)
        self.info = answer["info"]
        rates, ttfts, outputs = [], [], []
        generated = 0
        for rep in answer["repeats"]:
            generated = sum(len(t) for t in rep["outputs"])
            rates.append(generated / rep["seconds"])
            ttfts += rep["ttfts"]
            outputs.append(rep["outputs"])
        peak = MemoryPeak(answer.get("max_rss_bytes"), None, "VmHWM of the llama.cpp worker process")
        return Measurement(tokens_per_s=Spread.of(rates), generated_tokens=generated, ttft_s=Spread.of(ttfts),
                           outputs=outputs, peak=peak,
                           notes=[f"llama-cpp-python {self.info.get('version')}, {self.threads} threads"])


__all__ = ["LLAMACPP_PEERS", "LlamaCppPeer", "PYTHON_ENV", "llamacpp_missing", "resolve_python"]
