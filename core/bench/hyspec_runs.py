"""hyspec's side of the benchmark: one engine per method, timed over the workload's waves."""
from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any, Mapping

from hyspec import LLM, SamplingParams
from hyspec.bench.machine import MemoryPeak, PeakMemory
from hyspec.bench.measure import WARMUP_TOKENS, Measurement, Workload, acceptance_from_totals, timed_passes
from hyspec.bench.settings import NGRAM_MAX, NGRAM_MIN, PLAIN, BenchSettings, deep_merge
from hyspec.bench.stats import Spread
from hyspec.spec.config import MAX_SPECULATIVE_TOKENS
from hyspec.spec.registry import drafter_methods

#: suffix's draft-size ceiling in the bench: vLLM's default (suffix_decoding_max_tree_depth, 24)
SUFFIX_CEILING = 24


def speculative_config(method: str, settings: BenchSettings, drafters: Mapping[str, Path]) -> dict[str, Any] | None:
    """``method``'s speculative_config (None for plain decoding), with --speculative-config-extra laid over it.

    Prompt lookup matches 1..3-token n-grams, as transformers' prompt lookup
    does with ``max_matching_ngram_size=3``; every method drafts up to
    ``num_speculative_tokens`` tokens per step, except suffix, whose drafts size
    themselves under a ceiling of their tree depth (``suffix_decoding_max_tree_depth``, vLLM's default
    SUFFIX_CEILING unless --speculative-config-extra sets it).
    hybrid is the bandit policy over ngram, suffix and every drafter found (``drafters``: the methods
    whose weights were found).
    """
    if method == PLAIN:
        return None
    # suffix's ceiling follows its tree depth, as vLLM's default num_speculative_tokens for suffix does
    depth = settings.speculative_config_extra.get("suffix_decoding_max_tree_depth", SUFFIX_CEILING)
    suffix_ceiling = min(max(settings.num_speculative_tokens, int(depth)), MAX_SPECULATIVE_TOKENS)
    config: dict[str, Any] = {"method": method, "num_speculative_tokens": settings.num_speculative_tokens}
    if method == "ngram":
        config.update(prompt_lookup_min=NGRAM_MIN, prompt_lookup_max=NGRAM_MAX)
    elif method == "suffix":
        # a ceiling, not a length: suffix sizes each draft from its match (vLLM's default ceiling, the tree depth)
        config["num_speculative_tokens"] = suffix_ceiling
    elif method in drafter_methods():
        config["model"] = str(drafters[method])
    elif method == "hybrid":
        # the learned policy over every method that can run: the built-in rules name methods the default model
        # has no drafter for, and a hybrid that never drafts would measure nothing
        k = settings.num_speculative_tokens
        choices: list[dict[str, Any]] = [{"method": "ngram", "prompt_lookup_min": NGRAM_MIN,
                                          "prompt_lookup_max": NGRAM_MAX, "num_speculative_tokens": k},
                                         {"method": "suffix"}]  # suffix at the top-level ceiling, as alone
        choices += [{"method": m, "model": str(drafters[m]), "num_speculative_tokens": k}
                    for m in drafter_methods() if m in drafters]
        config["num_speculative_tokens"] = suffix_ceiling
        # EAGLE trees as alone (and as in a bare hybrid), not suffix_ceiling deep; within the default budget (32)
        config["tree"] = {"depth": min(k, 32)}
        config["hybrid"] = {"policy": "bandit", "methods": choices}
    return deep_merge(config, settings.speculative_config_extra)


def build_llm(model: Path, settings: BenchSettings, spec: dict[str, Any] | None):
    extra = {} if settings.kv_cache_bytes is None else {"kv_cache_bytes": settings.kv_cache_bytes}
    extra["enable_prefix_caching"] = settings.prefix_caching
    return LLM(str(model), speculative_config=spec, backend=settings.backend, dtype=settings.dtype,
               quantization=settings.quantization, **extra)


def close_llm(llm: Any) -> None:
    """Close an engine (drafters stopped, KV pool freed), so the next engine loads into free memory."""
    llm.close()


def _params(workload: Workload, index: int, max_tokens: int):
    return SamplingParams(temperature=workload.temperature, max_tokens=max_tokens, ignore_eos=True,
                          seed=workload.request_seed(index))


def _generate_wave(llm: Any, workload: Workload, wave: range, max_tokens: int) -> list[Any]:
    prompts = [list(workload.prompts[i]) for i in wave]
    return llm.generate(prompts, [_params(workload, i, max_tokens) for i in wave])


def _hybrid_choices(spec: Any) -> dict[str, Any]:
    """What the hybrid chose, for the JSON: steps per method and, under the bandit, per class of step
    (warm-up wave included: the bandit learns there too)."""
    dispatcher = getattr(spec, "dispatcher", None)
    if dispatcher is None:
        return {}
    snap = dispatcher.snapshot()
    out: dict[str, Any] = {"hybrid_decisions": {str(k): v for k, v in snap.decisions.items()}}
    if snap.bandit is not None:
        out["bandit_choices"] = {f"{klass} {arm}": n for (klass, arm), n in sorted(snap.bandit.choices.items())}
        out["bandit_goodput_tok_s"] = {f"{klass} {arm}": round(g, 1)
                                       for (klass, arm), g in sorted(snap.bandit.goodput.items())}
    return out


def run_workload(llm: Any, workload: Workload, repeats: int, peak: PeakMemory,
                 continuous: bool = False) -> Measurement:
    """Warm up on one wave, then time ``repeats`` passes over every wave.

    ``continuous``: a pass keeps ``batch_size`` requests in flight, handing the engine the next request
    as soon as one finishes (a client with vLLM's ``--max-concurrency``; the engine's own ``max_num_seqs``
    stays as configured), instead of waves that wait for their slowest request.
    """
    return _run_workload(llm, workload, repeats, peak, continuous)


_REQUEST_IDS = itertools.count()


def _generate_continuous(llm: Any, workload: Workload, indices: range, max_tokens: int) -> list[Any]:
    """Requests ``indices`` with at most ``workload.batch_size`` in the engine at a time, in order; outputs in
    request order."""
    engine = llm.engine
    queue = list(indices)
    in_flight: dict[str, int] = {}
    finals: dict[int, Any] = {}
    while queue or in_flight:
        while queue and len(in_flight) < workload.batch_size:
            i = queue.pop(0)
            seq = engine.add_request(list(workload.prompts[i]), _params(workload, i, max_tokens),
                                     f"bench-{next(_REQUEST_IDS)}")
            in_flight[seq.request_id] = i
        for out in engine.step():
            if out.finished and out.request_id in in_flight:
                finals[in_flight.pop(out.request_id)] = out
        if in_flight and not engine.has_unfinished_requests():
            raise RuntimeError(f"engine idle with requests in flight {sorted(in_flight)[:3]}")
    return [finals[i] for i in indices]


def _run_workload(llm: Any, workload: Workload, repeats: int, peak: PeakMemory, continuous: bool) -> Measurement:
    passes = PassRunner(llm, workload, continuous)
    peak.reset()
    for _ in range(repeats):
        passes.timed_pass()
    return passes.measurement(peak.read())


class PassRunner:
    """One engine on one workload, a timed pass at a time: what ``run_workload`` does in one go, cut so that
    ``hyspec bench --interleave`` can alternate engines pass by pass (drift on a shared machine then lands on
    every method alike).  Construction runs the untimed warm-up wave."""

    def __init__(self, llm: Any, workload: Workload, continuous: bool):
        self.llm, self.workload, self.continuous = llm, workload, continuous
        _generate_wave(llm, workload, workload.waves[0], min(WARMUP_TOKENS, workload.max_tokens))
        self.spec = llm.engine.spec if llm.engine.spec.enabled else None
        self.before = self.spec.metrics.snapshot()["totals"] if self.spec is not None else None
        self.rates: list[float] = []
        self.ttfts: list[float] = []
        self.outputs: list[list[list[int]]] = []
        self.generated = 0

    def _run_wave(self, wave: range) -> tuple[list[list[int]], list[float]]:
        generate = _generate_continuous if self.continuous else _generate_wave
        outs = generate(self.llm, self.workload, wave, self.workload.max_tokens)
        ttfts = [o.metrics.ttft for o in outs if o.metrics is not None and o.metrics.ttft is not None]
        return [list(o.outputs[0].token_ids) for o in outs], ttfts

    def _forget_between_passes(self) -> None:  # a pass must not draft from, nor reuse the KV of, the previous one
        self.llm.engine.spec.forget_shared_history()
        self.llm.reset_prefix_cache()

    def timed_pass(self) -> float:
        """One timed pass over the whole workload; its tokens/s."""
        rates, ttfts, outputs, generated = timed_passes(
            self.workload, 1, self._run_wave, before_pass=self._forget_between_passes,
            waves=[range(len(self.workload.prompts))] if self.continuous else None)
        self.rates += rates
        self.ttfts += ttfts
        self.outputs += outputs
        self.generated = generated
        return rates[0]

    def measurement(self, memory: MemoryPeak) -> Measurement:
        spec = self.spec
        acceptance = (acceptance_from_totals(self.before, spec.metrics.snapshot()["totals"])
                      if spec is not None else None)
        if acceptance is not None:
            acceptance.update(_hybrid_choices(spec))
        return Measurement(tokens_per_s=Spread.of(self.rates), generated_tokens=self.generated,
                           ttft_s=Spread.of(self.ttfts) if self.ttfts else None, outputs=self.outputs, peak=memory,
                           acceptance=acceptance)
