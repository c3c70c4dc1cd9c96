"""Greedy identity of every drafting method on a backend, and the KV pool left clean after each run.

All runs use the tiny target of :mod:`hyspec.conformance.tiny` and ragged
prompts (some crossing KV pages), at batch size 1 and as one ragged batch,
with the goodput controller off (it reacts to timing noise; this is about
tokens).  A method is discovered at run time: its drafter is built (random
weights) through its training recipe (``hyspec.train.registry``) and saved
in the public layout its loader reads; a method missing from this build is
skipped with the reason.  Random drafters are rarely accepted, so two runs
exercise long accepted paths on purpose: ``ngram`` on prompts that repeat a
motif, and ``draft_model (self)``, the target drafting for itself (every
draft accepted: bonus tokens, KV compaction of long paths).

``plain`` compares the engine's plain decoding on the backend with a
cache-free greedy decoding of the same weights by the reference model on the
CPU in the engine's dtype (fp32 on CPU targets, bf16 on accelerators): the
cross-backend identity.  Every method is then compared with
the backend's plain decoding.  A divergence is allowed only at a measured
near-tie (``hyspec.numerics``) and is reported; anything else fails.
"""
from __future__ import annotations

import json
import logging
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from hyspec.backends.records import DRAFTING_METHODS
from hyspec.conformance.report import CaseResult, CheckResult
from hyspec.conformance.targets import INTERPRETER, Target, engine_backend
from hyspec.conformance.tiny import make_tiny_target, prompts
from hyspec.errors import HyspecError

SPEC_TOKENS = 4
CONTROLLER_OFF = {"controller": {"enabled": False, "profile_at_startup": False}}
#: options that keep random drafters tiny (None: the recipe's defaults, already small for a 64-wide target)
DRAFTER_OPTIONS: dict[str, dict[str, Any]] = {"draft_model": {"layers": 1, "hidden_size": 32}}
SELF_DRAFT = "draft_model (self)"
#: what a full run checks under the Triton interpreter: prefill, chains and trees with compaction, on the kernels
INTERPRETER_METHODS = ("plain", "ngram", SELF_DRAFT)


@dataclass(frozen=True)
class MethodSettings:
    num_prompts: int = 6
    max_tokens: int = 16
    single_prompts: int = 2  # how many prompts also run alone (batch size 1)
    methods: tuple[str, ...] | None = None  # None: every method
    why_not: str = ""  # the skip reason of the methods left out

    @classmethod
    def for_target(cls, target: Target, quick: bool) -> "MethodSettings":
        if target.mode == INTERPRETER:
            # ~1 s per interpreted attention call: the engine runs a few steps a second at best, so only
            # the runs that put the kernels through prefill, chains, trees and compaction, on short sequences
            chosen = ("plain",) if quick else INTERPRETER_METHODS
            return cls(num_prompts=2, max_tokens=6, single_prompts=1, methods=chosen,
                       why_not="too slow under the Triton interpreter (~1 s per attention call): checked on a CUDA "
                               "GPU; under the interpreter a full run (no --quick) checks "
                               + ", ".join(INTERPRETER_METHODS))
        return cls(num_prompts=4, max_tokens=12, single_prompts=1) if quick else cls()


@dataclass
class Workspace:
    """The tiny target, drafters built on demand, and cached reference outputs (one per process run)."""

    root: Path
    target_dir: Path = field(init=False)
    _drafters: dict[str, Path | HyspecError] = field(default_factory=dict, init=False)
    _oracle: dict[tuple[int, int, str], list[list[int]]] = field(default_factory=dict, init=False)
    _plain: dict[tuple[str, str, int, int], list[list[int]]] = field(default_factory=dict, init=False)
    _reference_models: dict[str, Any] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        self.target_dir = make_tiny_target(self.root / "target")

    @classmethod
    def create(cls) -> "Workspace":
        return cls(Path(tempfile.mkdtemp(prefix="hyspec-conformance-")))

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)

    def reference_model(self, dtype: str = "float32"):
        """The tiny target in ``dtype`` on the CPU with the reference ops."""
        if dtype not in self._reference_models:
            from hyspec.model.loader import load_model

            self._reference_models[dtype] = load_model(self.target_dir, dtype=dtype)
        return self._reference_models[dtype]

    def drafter(self, method: str) -> Path:
        """A random drafter for ``method`` saved in its public layout; HyspecError when the build lacks it."""
        if method not in self._drafters:
            try:
                self._drafters[method] = self._build_drafter(method)
            except HyspecError as exc:
                self._drafters[method] = exc
        found = self._drafters[method]
        if isinstance(found, HyspecError):
            raise found
        return found

    def _build_drafter(self, method: str) -> Path:
        from hyspec.train.registry import resolve_recipe

        recipe = resolve_recipe(method)  # "not available in this build" when the method's module is absent
        out = self.root / f"drafter-{method}"
        out.mkdir(exist_ok=True)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            drafter = recipe.build(self.reference_model(), dict(DRAFTER_OPTIONS.get(method, {})))
            recipe.save(drafter.eval(), self.target_dir, out)
        return out

    def oracle(self, settings: MethodSettings, dtype: str) -> list[list[int]]:
        """Cache-free greedy continuations by the reference model (CPU, in the engine's dtype)."""
        key = (settings.num_prompts, settings.max_tokens, dtype)
        if key not in self._oracle:
            model = self.reference_model(dtype)
            outs = []
            with torch.no_grad():
                for prompt in prompts(settings.num_prompts):
                    seq = list(prompt)
                    for _ in range(settings.max_tokens):
                        hidden = model.forward_dense(torch.tensor([seq])).hidden[0, -1:]
                        seq.append(int(model.compute_logits(hidden)[0].argmax()))
                    outs.append(seq[len(prompt):])
            self._oracle[key] = outs
        return self._oracle[key]

    def reference_logits(self, prefix: list[int], dtype: str) -> torch.Tensor:  # [V] fp32 next-token logits
        model = self.reference_model(dtype)
        with torch.no_grad():
            return model.compute_logits(model.forward_dense(torch.tensor([prefix])).hidden[0, -1:])[0]


def engine_dtype(target: Target) -> str:
    """fp32 where the kernels serve it; bf16 on accelerators (the NPU's FIA takes no fp32, serving uses bf16)."""
    return "float32" if target.device.type == "cpu" else "bfloat16"


def _llm(target: Target, ws: Workspace, spec: dict[str, Any] | None):
    from hyspec import LLM

    with engine_backend(target) as backend:
        return LLM(str(ws.target_dir), backend=backend, dtype=engine_dtype(target), kv_cache_bytes=8 << 20,
                   speculative_config=None if spec is None else {**CONTROLLER_OFF, **spec})


def _generate(llm, batch: list[list[int]], max_tokens: int) -> list[list[int]]:
    from hyspec import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    return [o.outputs[0].token_ids for o in llm.generate([list(p) for p in batch], params)]


def _compare(ws: Workspace, target: Target, label: str, expected: list[list[int]], actual: list[list[int]],
             batch: list[list[int]]) -> CaseResult:
    from hyspec.numerics import classify_divergence

    dtype = getattr(torch, engine_dtype(target))
    near_ties = []
    for prompt, exp, act in zip(batch, expected, actual):
        if exp == act:
            continue
        index = next((i for i, (a, b) in enumerate(zip(exp, act)) if a != b), min(len(exp), len(act)))
        logits = (ws.reference_logits(list(prompt) + exp[:index], engine_dtype(target))
                  if index < min(len(exp), len(act)) else None)
        verdict = classify_divergence(exp, act, logits, dtype)
        if not verdict.allowed:
            return CaseResult(label=label, status="fail", detail=verdict.describe())
        near_ties.append(verdict.describe())
    detail = f"{len(batch)} sequences identical" if not near_ties else "allowed " + "; ".join(near_ties)
    return CaseResult(label=label, status="pass", detail=detail)


def _pool_case(llm) -> CaseResult:
    """No leaked or double-owned pages: the pool's own invariant check, and every page back in the free list."""
    pool = llm.engine.pool
    try:
        pool.check_invariants()
    except Exception as exc:
        return CaseResult(label="kv pool", status="fail", detail=f"invariants broken: {exc}")
    owners = {k: v for k, v in pool.pages_by_owner().items() if k != "free" and v}
    if pool.num_free != pool.num_pages or owners:
        return CaseResult(label="kv pool", status="fail",
                          detail=f"{pool.num_pages - pool.num_free} pages still held after every request finished: "
                                 f"{owners}")
    return CaseResult(label="kv pool", status="pass", detail="every page freed, ownership consistent")


def plain_outputs(target: Target, ws: Workspace, settings: MethodSettings) -> list[list[int]]:
    key = (target.name, target.mode, settings.num_prompts, settings.max_tokens)
    if key not in ws._plain:
        ws._plain[key] = _generate(_llm(target, ws, None), prompts(settings.num_prompts), settings.max_tokens)
    return ws._plain[key]


def check_plain(target: Target, ws: Workspace, settings: MethodSettings) -> CheckResult:
    """The backend's plain decoding equals the reference model's cache-free greedy decoding."""
    batch = prompts(settings.num_prompts)
    try:
        llm = _llm(target, ws, None)
        actual = _generate(llm, batch, settings.max_tokens)
    except Exception as exc:
        return CheckResult("plain", "error", detail=f"{type(exc).__name__}: {exc}")
    ws._plain[(target.name, target.mode, settings.num_prompts, settings.max_tokens)] = actual
    dtype = engine_dtype(target)
    cases = [_compare(ws, target, f"plain decoding vs the reference model (CPU, {dtype}, cache-free)",
                      ws.oracle(settings, dtype), actual, batch), _pool_case(llm)]
    result = CheckResult.from_cases("plain", cases)
    result.detail = f"{engine_dtype(target)}, {len(batch)} ragged prompts x {settings.max_tokens} tokens: " + (
        cases[0].detail if cases[0].status == "pass" else "see cases")
    return result


def method_config(method: str, ws: Workspace) -> dict[str, Any]:
    """speculative_config for ``method`` on the tiny target (HyspecError when the build lacks it)."""
    if method == "ngram":
        return {"method": "ngram", "num_speculative_tokens": SPEC_TOKENS, "prompt_lookup_min": 1,
                "prompt_lookup_max": 3}
    if method == SELF_DRAFT:
        return {"method": "draft_model", "model": str(ws.target_dir), "num_speculative_tokens": SPEC_TOKENS}
    if method == "hybrid":
        other = str(ws.drafter("draft_model"))
        rules = ws.root / "hybrid_rules.json"
        # every sequence starts on ngram and moves to draft_model once its context grows: both run, and switch
        rules.write_text(json.dumps([{"when": "max_context_length < 24", "method": "ngram"},
                                     {"method": "draft_model"}]))
        return {"method": "hybrid", "num_speculative_tokens": SPEC_TOKENS, "hybrid": {
            "rules_path": str(rules), "methods": [{"method": "ngram", "prompt_lookup_min": 1, "prompt_lookup_max": 3},
                                                  {"method": "draft_model", "model": other}]}}
    return {"method": method, "model": str(ws.drafter(method)), "num_speculative_tokens": SPEC_TOKENS}


def check_method(target: Target, ws: Workspace, method: str, settings: MethodSettings) -> CheckResult:
    """Greedy identity of ``method`` against the backend's plain decoding, at batch 1 and batched; KV clean."""
    if settings.methods is not None and method not in settings.methods:
        return CheckResult(method, "skip", detail=settings.why_not)
    batch = prompts(settings.num_prompts)
    started = time.perf_counter()
    try:
        spec = method_config(method, ws)
        expected = plain_outputs(target, ws, settings)
        llm = _llm(target, ws, spec)
        single = [_generate(llm, [p], settings.max_tokens)[0] for p in batch[:settings.single_prompts]]
        together = _generate(llm, batch, settings.max_tokens)
    except Exception as exc:  # one method's failure is its own row; the others still run
        if isinstance(exc, HyspecError) and "not available in this build" in str(exc):
            return CheckResult(method, "skip", detail=f"not in this build: {exc}")
        return CheckResult(method, "error", detail=f"{type(exc).__name__}: {exc}")
    cases = [_compare(ws, target, "batch size 1", expected[:len(single)], single, batch[:len(single)]),
             _compare(ws, target, f"ragged batch of {len(batch)}", expected, together, batch),
             _pool_case(llm)]
    totals = llm.engine.spec.metrics.snapshot()["totals"]
    drafted, accepted = totals["draft_tokens"], totals["accepted_tokens"]
    if drafted == 0:
        cases.append(CaseResult(label="speculated", status="fail", detail="no draft token was verified: "
                                "the method never ran, so identity proves nothing"))
    if method == SELF_DRAFT and engine_dtype(target) == "float32" and accepted != drafted:
        cases.append(CaseResult(label="self-draft acceptance", status="fail",
                                detail=f"the target drafting for itself had {drafted - accepted} of {drafted} "
                                       "drafts rejected (fp32): drafter and verifier disagree"))
    if method == "hybrid":
        decisions = llm.engine.spec.dispatcher.snapshot().decisions
        used = sorted(m for m, n in decisions.items() if n and m != "none")
        if len(used) < 2:
            cases.append(CaseResult(label="switching", status="fail", detail=f"only {used} chosen"))
    result = CheckResult.from_cases(method, cases)
    rate = accepted / drafted if drafted else 0.0
    near_ties = [f"{c.label}: {c.detail}" for c in cases if c.detail.startswith("allowed")]
    same = "identical" + (f" up to reported near-ties ({'; '.join(near_ties)})" if near_ties else "")
    result.detail = (f"{same}: {len(batch)} ragged prompts x {settings.max_tokens} tokens, {drafted} drafted, "
                     f"{accepted} accepted ({rate:.0%}), KV clean, {time.perf_counter() - started:.1f}s"
                     if result.status == "pass" else "; ".join(c.detail for c in cases if c.status != "pass"))
    return result


def methods_to_check() -> list[str]:
    """Every method docs/architecture.md §5 lists, plus the self-drafting run; discovery happens when each is built."""
    methods = list(DRAFTING_METHODS)
    methods.insert(methods.index("draft_model") + 1, SELF_DRAFT)
    return methods


def check_methods(target: Target, ws: Workspace, quick: bool) -> dict[str, CheckResult]:
    settings = MethodSettings.for_target(target, quick)
    # random drafters are expected to be rejected: the draft-quality monitor's warnings would only be noise
    quality_log = logging.getLogger("hyspec.spec.quality")
    level = quality_log.level
    quality_log.setLevel(logging.ERROR)
    try:
        out = {"plain": check_plain(target, ws, settings)}
        for method in methods_to_check():
            out[method] = check_method(target, ws, method, settings)
    finally:
        quality_log.setLevel(level)
    return out


__all__ = ["MethodSettings", "SELF_DRAFT", "Workspace", "check_method", "check_methods", "check_plain",
           "method_config", "methods_to_check"]
