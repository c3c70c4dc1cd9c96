"""Engines timed pass by pass in one process, for the A/B scripts beside the results they produced.

Why: on a shared VM whose speed drifts 10-20 % over minutes, two configurations measured one after the
other compare the drift as much as the code.  Here every engine stays loaded, and each round runs the same
waves on every engine in turn, so the drift lands on all of them; the median over rounds is reported.
Outputs are compared with the first engine's (plain decoding by convention), so a speed figure never
stands without its token identity.
"""
from __future__ import annotations

import json
import statistics
import time
from typing import Any, Callable, Mapping, Sequence
from hyspec.assets import default_model
from hyspec.bench.workloads import workload_requests
from hyspec.model.tokenizer import Tokenizer


def interleaved_rates(engines: Mapping[str, Any], waves: Sequence[Sequence[Any]], params: Any, rounds: int,
                      before_pass: Callable[[str, Any], None] | None = None) -> tuple[dict[str, list[float]], int]:
    """Generated tokens per second of each engine (an ``LLM``) per round, and how many outputs differed from
    the first engine's.  ``waves``: the prompts of one pass, one ``generate`` call per wave;
    ``before_pass(name, llm)`` runs before each engine's pass (untimed), after its suffix caches were
    emptied (``forget_shared_history``, as the bench does between passes)."""
    if rounds < 1 or not engines or not waves:
        raise ValueError("interleaved_rates needs engines, waves and rounds >= 1")
    rates: dict[str, list[float]] = {name: [] for name in engines}
    mismatches = 0
    for _ in range(rounds):
        reference = None
        for name, llm in engines.items():
            spec = getattr(llm.engine, "spec", None)
            if spec is not None:
                spec.forget_shared_history()
            if before_pass is not None:
                before_pass(name, llm)
            t0 = time.perf_counter()
            outs = [list(o.outputs[0].token_ids) for wave in waves
                    for o in llm.generate(list(wave), params, use_tqdm=False)]
            rates[name].append(sum(map(len, outs)) / (time.perf_counter() - t0))
            if reference is None:
                reference = outs
            else:
                mismatches += sum(a != b for a, b in zip(reference, outs))
    return rates, mismatches


def workload_prompts(workload: str, num_prompts: int) -> list[list[int]]:
    """The default model's token ids of ``workload``'s first ``num_prompts`` requests (hyspec.bench.workloads), the
    chat-template ones without a second set of special tokens."""
    tok = Tokenizer(default_model())
    return [tok.encode(text, add_special_tokens=not templated)
            for text, templated in workload_requests(workload, tok.apply_chat_template, num_prompts)]


def waves_of(prompts: Sequence[Any], batch_size: int) -> list[list[Any]]:
    """``prompts`` in waves of ``batch_size`` (the last may be short): one ``generate`` call each."""
    return [list(prompts[i:i + batch_size]) for i in range(0, len(prompts), batch_size)]


def rounded(rates: Mapping[str, Sequence[float]]) -> dict[str, list[float]]:
    """Every pass's rate to one decimal, for a results file."""
    return {name: [round(r, 1) for r in v] for name, v in rates.items()}


def close_and_save(engines: Mapping[str, Any], out: Mapping[str, Any], path: str | None) -> None:
    """Close every engine, then write ``out`` as JSON to ``path`` (nothing when None)."""
    for llm in engines.values():
        llm.close()
    if path:
        with open(path, "w") as f:
            json.dump(out, f, indent=1)


def medians(rates: Mapping[str, Sequence[float]]) -> dict[str, float]:
    """Each engine's median rate, rounded for a results file."""
    return {name: round(statistics.median(v), 1) for name, v in rates.items()}


def ratio(med: Mapping[str, float], a: str, b: str) -> float:
    """``med[a] / med[b]`` to three places."""
    return round(med[a] / med[b], 3)


__all__ = ["close_and_save", "interleaved_rates", "medians", "ratio", "rounded", "waves_of", "workload_prompts"]
