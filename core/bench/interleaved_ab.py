"""Engines timed pass by pass in one process, for the A/B scripts beside the results they produced.

Why: on a shared VM whose speed drifts 10-20 % over minutes, two configurations measured one after the
other compare the drift as much as the code.  Here every engine stays loaded, and each round runs the same
waves on every engine in turn, so the drift lands on all of them; the median over rounds is reported.
Outputs are compared with the first engine's (plain decoding by convention), so a speed figure never
stands without its token identity.
"""
from __future__ import annotations

import statistics
import time
from typing import Any, Callable, Mapping, Sequence


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


def medians(rates: Mapping[str, Sequence[float]]) -> dict[str, float]:
    """Each engine's median rate, rounded for a results file."""
    return {name: round(statistics.median(v), 1) for name, v in rates.items()}


def ratio(med: Mapping[str, float], a: str, b: str) -> float:
    """``med[a] / med[b]`` to three places."""
    return round(med[a] / med[b], 3)


__all__ = ["interleaved_rates", "medians", "ratio"]
