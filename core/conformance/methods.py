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

from hyspec import LLM, SamplingParams
from hyspec.backends.records import drafting_methods
from hyspec.conformance.identity import excess_near_ties, judge_outputs, measure_rule
from hyspec.conformance.report import CaseResult, CheckResult
from hyspec.conformance.targets import INTERPRETER, Target, engine_backend
from hyspec.conformance.tiny import make_tiny_target, prompts
from hyspec.errors import HyspecError
from hyspec.model.loader import load_model
from hyspec.model.tokenizer import Tokenizer
from hyspec.numerics import classify_divergence
from hyspec.spec import registry
from hyspec.train.registry import resolve_recipe

SPEC_TOKENS = 4
CONTROLLER_OFF = {"controller": {"enabled": False, "profile_at_startup": False}}
#: options that keep random drafters tiny (None: the recipe's defaults, already small for a 64-wide target)
DRAFTER_OPTIONS: dict[str, dict[str, Any]] = {"draft_model": {"layers": 1, "hidden_size": 32}}
SELF_DRAFT = "draft_model (self)"
#: what a full run checks under the Triton interpreter: prefill, chains and trees with compaction, on the kernels
INTERPRETER_METHODS = ("plain", "ngram", SELF_DRAFT)


#: prompts for a real target (--model): code and prose of the kinds users send, none from HumanEval
REAL_PROMPTS = (
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "The capital of France is",
    "import os\n\nfor root, dirs, files in os.walk('.'):\n",
    "Explain in one sentence why the sky is blue.",
    "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n",
    "Write a haiku about autumn leaves falling on a quiet river.",
    "SELECT name, COUNT(*) FROM orders GROUP BY",
    "Q: What is 17 times 23?\nA:",
)


@dataclass(frozen=True)
class MethodSettings:
    num_prompts: int = 6
    max_tokens: int = 16
    single_prompts: int = 2  # how many prompts also run alone (batch size 1)
    methods: tuple[str, ...] | None = None  # None: every method
    why_not: str = ""  # the skip reason of the methods left out

    @classmethod
    def for_target(cls, target: Target, quick: bool, real_model: bool = False) -> "MethodSettings":
        if target.mode == INTERPRETER:
            # ~1 s per interpreted attention call: the engine runs a few steps a second at best, so only
            # the runs that put the kernels through prefill, chains, trees and compaction, on short sequences
            chosen = ("plain",) if quick else INTERPRETER_METHODS
            return cls(num_prompts=2, max_tokens=6, single_prompts=1, methods=chosen,
                       why_not="too slow under the Triton interpreter (~1 s per attention call): checked on a CUDA "
                               "GPU; under the interpreter a full run (no --quick) checks "
                               + ", ".join(INTERPRETER_METHODS))
        if real_model:  # a real target: longer generations, where near-ties really occur
            return cls(num_prompts=4, max_tokens=16, single_prompts=1) if quick else cls(8, 32, 2)
        return cls(num_prompts=4, max_tokens=12, single_prompts=1) if quick else cls()


@dataclass
class Workspace:
    """The tiny target, drafters built on demand, and cached reference outputs (one per process run)."""

    root: Path
    target_dir: Path = field(init=False)
    _drafters: dict[str, Path | HyspecError] = field(default_factory=dict, init=False)
    _oracle: dict[tuple[int, int, str], list[list[int]]] = field(default_factory=dict, init=False)
    model: Path | None = None  # the target; None: the tiny target, written into root
    dtype: str | None = None  # the engines' dtype; None: engine_dtype's choice for the backend
    _plain: dict[tuple[str, str, int, int], list[list[int]]] = field(default_factory=dict, init=False)
    _reference_models: dict[str, Any] = field(default_factory=dict, init=False)
    plain_llms: dict[tuple[str, str], Any] = field(default_factory=dict, init=False)
    rules: dict[tuple[str, str, int, int], Any] = field(default_factory=dict, init=False)  # NearTieRule
    plain_identity: dict[tuple[str, str, int, int], Any] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        self.target_dir = self.model if self.model is not None else make_tiny_target(self.root / "target")

    @classmethod
    def create(cls, model: str | Path | None = None, dtype: str | None = None) -> "Workspace":
        return cls(Path(tempfile.mkdtemp(prefix="hyspec-conformance-")), None if model is None else Path(model),
                   dtype)

    def prompts(self, count: int) -> list[list[int]]:
        """Ragged prompts: byte-id motifs for the tiny target, real text through a real target's tokenizer."""
        if self.model is None:
            return prompts(count)
        tokenizer = Tokenizer(self.target_dir)
        return [tokenizer.encode(REAL_PROMPTS[i % len(REAL_PROMPTS)]) for i in range(count)]

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)

    def reference_model(self, dtype: str = "float32"):
        """The tiny target in ``dtype`` on the CPU with the reference ops."""
        if dtype not in self._reference_models:
            # served at the engines' max_model_len: a longrope target picks the same factor set (model/rope.py)
            self._reference_models[dtype] = load_model(self.target_dir, dtype=dtype, context_length=MAX_MODEL_LEN)
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
                for prompt in self.prompts(settings.num_prompts):
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


def engine_dtype(target: Target, ws: "Workspace | None" = None) -> str:
    """The workspace's --dtype if set; else fp32 where the kernels serve it, bf16 on accelerators (the NPU's
    FIA takes no fp32, serving uses bf16; so does an emulated NPU, whose device is the host)."""
    if ws is not None and ws.dtype is not None:
        return ws.dtype
    return "float32" if target.device.type == "cpu" and target.name != "npu" else "bfloat16"


#: room for the longest conformance sequence plus draft lookahead (prompts <= 40 tokens)
MAX_MODEL_LEN = 256


def _llm(target: Target, ws: Workspace, spec: dict[str, Any] | None):
    with engine_backend(target) as backend:
        return LLM(str(ws.target_dir), backend=backend, dtype=engine_dtype(target, ws), kv_cache_bytes=32 << 20,
                   max_model_len=MAX_MODEL_LEN,
                   speculative_config=None if spec is None else {**CONTROLLER_OFF, **spec})


def plain_llm(target: Target, ws: Workspace):
    """The target's plain engine on ``target``: it computes the teacher-forced reference logits."""
    key = (target.name, target.mode)
    if key not in ws.plain_llms:
        ws.plain_llms[key] = _llm(target, ws, None)
    return ws.plain_llms[key]


def _generate(llm, batch: list[list[int]], max_tokens: int) -> list[list[int]]:
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    return [o.outputs[0].token_ids for o in llm.generate([list(p) for p in batch], params)]


def _compare(ws: Workspace, target: Target, label: str, expected: list[list[int]], actual: list[list[int]],
             batch: list[list[int]]) -> CaseResult:
    """Cross-backend: first divergence against the CPU reference model, under the dtype's ceiling.

    The rounding between two machines' kernels is not what batch compositions measure, so this
    comparison keeps the a-priori ceiling of hyspec.numerics; every comparison on one backend uses
    the measured rule (``_identity_case``).
    """
    dtype = getattr(torch, engine_dtype(target, ws))
    near_ties = []
    for prompt, exp, act in zip(batch, expected, actual):
        if exp == act:
            continue
        index = next((i for i, (a, b) in enumerate(zip(exp, act)) if a != b), min(len(exp), len(act)))
        logits = (ws.reference_logits(list(prompt) + exp[:index], engine_dtype(target, ws))
                  if index < min(len(exp), len(act)) else None)
        verdict = classify_divergence(exp, act, logits, dtype)
        if not verdict.allowed:
            return CaseResult(label=label, status="fail", detail=verdict.describe())
        near_ties.append(verdict.describe())
    detail = f"{len(batch)} sequences identical" if not near_ties else "allowed " + "; ".join(near_ties)
    return CaseResult(label=label, status="pass", detail=detail)


def _identity_case(target: Target, ws: Workspace, label: str, batch: list[list[int]], outputs: list[list[int]],
                   max_tokens: int, rule):
    """Teacher-forced identity of ``outputs`` on the backend's plain engine; (case, report)."""
    report = judge_outputs(plain_llm(target, ws).engine, batch, outputs, rule,
                           expected_lengths=[max_tokens] * len(batch))
    return CaseResult(label=label, status="pass" if report.passed else "fail", detail=report.describe()), report


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


def _key(target: Target, settings: MethodSettings) -> tuple[str, str, int, int]:
    return (target.name, target.mode, settings.num_prompts, settings.max_tokens)


def plain_outputs(target: Target, ws: Workspace, settings: MethodSettings) -> list[list[int]]:
    key = _key(target, settings)
    if key not in ws._plain:
        ws._plain[key] = _generate(plain_llm(target, ws), ws.prompts(settings.num_prompts), settings.max_tokens)
    return ws._plain[key]


def near_tie_rule(target: Target, ws: Workspace, settings: MethodSettings):
    """The measured rule (hyspec.numerics.NearTieRule) for this backend, dtype and target."""
    key = _key(target, settings)
    if key not in ws.rules:
        batch = ws.prompts(settings.num_prompts)
        ws.rules[key] = measure_rule(plain_llm(target, ws).engine, batch, plain_outputs(target, ws, settings),
                                     chunk=SPEC_TOKENS + 1)
    return ws.rules[key]


def plain_vs_plain(target: Target, ws: Workspace, settings: MethodSettings):
    """Plain decoding one sequence at a time, judged like a method: the near-tie rate rounding alone gives."""
    key = _key(target, settings)
    if key not in ws.plain_identity:
        batch = ws.prompts(settings.num_prompts)
        llm = plain_llm(target, ws)
        alone = [_generate(llm, [p], settings.max_tokens)[0] for p in batch]
        ws.plain_identity[key] = judge_outputs(llm.engine, batch, alone, near_tie_rule(target, ws, settings),
                                               expected_lengths=[settings.max_tokens] * len(batch))
    return ws.plain_identity[key]


def check_plain(target: Target, ws: Workspace, settings: MethodSettings) -> CheckResult:
    """The backend's plain decoding equals the reference model's; the near-tie rule measured; plain vs plain."""
    batch = ws.prompts(settings.num_prompts)
    try:
        actual = plain_outputs(target, ws, settings)
        rule = near_tie_rule(target, ws, settings)
        alone = plain_vs_plain(target, ws, settings)
        llm = plain_llm(target, ws)
    except Exception as exc:
        return CheckResult("plain", "error", detail=f"{type(exc).__name__}: {exc}")
    dtype = engine_dtype(target, ws)
    cases = [_compare(ws, target, f"plain decoding vs the reference model (CPU, {dtype}, cache-free)",
                      ws.oracle(settings, dtype), actual, batch),
             CaseResult(label="near-tie rule", status="pass", detail=rule.describe()),
             CaseResult(label="plain batch size 1 vs plain ragged batch (teacher-forced)",
                        status="pass" if alone.passed else "fail", detail=alone.describe()),
             _pool_case(llm)]
    result = CheckResult.from_cases("plain", cases)
    result.identity = {"rule": {"bound": rule.bound, "measured": rule.measured, "positions": rule.positions},
                       "plain_vs_plain": alone.to_dict()}
    result.detail = (f"{dtype}, {len(batch)} ragged prompts x {settings.max_tokens} tokens: "
                     f"{'same as the reference model' if cases[0].status == 'pass' else 'see cases'}; "
                     f"{rule.describe()}; plain batch 1 vs batched: {alone.describe()}")
    return result


def method_config(method: str, ws: Workspace) -> dict[str, Any]:
    """speculative_config for ``method`` on the tiny target (HyspecError when the build lacks it)."""
    if method == "ngram":
        return {"method": "ngram", "num_speculative_tokens": SPEC_TOKENS, "prompt_lookup_min": 1,
                "prompt_lookup_max": 3}
    if method == SELF_DRAFT:
        # dense: a drafter on int8 kernels (the default) would differ from its own target at near-ties,
        # and this run's point is that every draft is accepted
        return {"method": "draft_model", "model": str(ws.target_dir), "num_speculative_tokens": SPEC_TOKENS,
                "quantization": "none"}
    if method == "hybrid":
        other = str(ws.drafter("draft_model"))
        rules = ws.root / "hybrid_rules.json"
        # every sequence starts on ngram and moves to draft_model once its context grows: both run, and switch
        rules.write_text(json.dumps([{"when": "max_context_length < 24", "method": "ngram"},
                                     {"method": "draft_model"}]))
        return {"method": "hybrid", "num_speculative_tokens": SPEC_TOKENS, "hybrid": {
            "rules_path": str(rules), "methods": [{"method": "ngram", "prompt_lookup_min": 1, "prompt_lookup_max": 3},
                                                  {"method": "draft_model", "model": other}]}}
    if method not in registry.drafter_methods():  # suffix, and any other weightless method: nothing to train
        return {"method": method, "num_speculative_tokens": SPEC_TOKENS}
    return {"method": method, "model": str(ws.drafter(method)), "num_speculative_tokens": SPEC_TOKENS}


def check_method(target: Target, ws: Workspace, method: str, settings: MethodSettings) -> CheckResult:
    """Greedy identity of ``method`` against the backend's plain decoding, at batch 1 and batched; KV clean."""
    if settings.methods is not None and method not in settings.methods:
        return CheckResult(method, "skip", detail=settings.why_not)
    batch = ws.prompts(settings.num_prompts)
    started = time.perf_counter()
    try:
        spec = method_config(method, ws)
        llm = _llm(target, ws, spec)
        single = [_generate(llm, [p], settings.max_tokens)[0] for p in batch[:settings.single_prompts]]
        together = _generate(llm, batch, settings.max_tokens)
    except Exception as exc:  # one method's failure is its own row; the others still run
        if isinstance(exc, HyspecError) and "not available in this build" in str(exc):
            return CheckResult(method, "skip", detail=f"not in this build: {exc}")
        return CheckResult(method, "error", detail=f"{type(exc).__name__}: {exc}")
    rule = near_tie_rule(target, ws, settings)
    plain = plain_vs_plain(target, ws, settings)
    case_1, report_1 = _identity_case(target, ws, "batch size 1", batch[:len(single)], single,
                                      settings.max_tokens, rule)
    case_n, report_n = _identity_case(target, ws, f"ragged batch of {len(batch)}", batch, together,
                                      settings.max_tokens, rule)
    report = report_1.merge(report_n)
    cases = [case_1, case_n, _near_tie_rate_case(report, plain), _pool_case(llm)]
    totals = llm.engine.spec.metrics.snapshot()["totals"]
    drafted, accepted = totals["draft_tokens"], totals["accepted_tokens"]
    if drafted == 0:
        cases.append(CaseResult(label="speculated", status="fail", detail="no draft token was verified: "
                                "the method never ran, so identity proves nothing"))
    if method == SELF_DRAFT and engine_dtype(target, ws) == "float32" and accepted != drafted:
        cases.append(CaseResult(label="self-draft acceptance", status="fail",
                                detail=f"the target drafting for itself had {drafted - accepted} of {drafted} "
                                       "drafts rejected (fp32): drafter and verifier disagree"))
    if method == "hybrid":
        decisions = llm.engine.spec.dispatcher.snapshot().decisions
        used = sorted(m for m, n in decisions.items() if n and m != "none")
        if len(used) < 2:
            cases.append(CaseResult(label="switching", status="fail", detail=f"only {used} chosen"))
    result = CheckResult.from_cases(method, cases)
    result.identity = {**report.to_dict(), "plain_near_tie_rate": plain.near_tie_rate, "bound": rule.bound,
                       "drafted": drafted, "accepted": accepted}
    rate = accepted / drafted if drafted else 0.0
    result.detail = (f"{report.describe()} (plain vs plain: {len(plain.near_ties)} of {plain.positions}); "
                     f"{drafted} drafted, {accepted} accepted ({rate:.0%}), KV clean, "
                     f"{time.perf_counter() - started:.1f}s"
                     if result.status == "pass" else "; ".join(c.detail for c in cases if c.status != "pass"))
    return result


def _near_tie_rate_case(report, plain) -> CaseResult:
    """A method may not find more near-ties than plain decoding does at another batch size, beyond noise."""
    excess = excess_near_ties(report, plain)
    detail = (f"{len(report.near_ties)} near-ties in {report.positions} positions vs plain-vs-plain "
              f"{len(plain.near_ties)} in {plain.positions} ({excess:+.1f} sd beyond, limit 3)")
    return CaseResult(label="near-tie rate", status="pass" if excess <= 3 else "fail", detail=detail)


def methods_to_check() -> list[str]:
    """Every method docs/architecture.md §5 lists, plus the self-drafting run; discovery happens when each is built."""
    methods = list(drafting_methods())
    methods.insert(methods.index("draft_model") + 1, SELF_DRAFT)
    return methods


def check_methods(target: Target, ws: Workspace, quick: bool) -> dict[str, CheckResult]:
    settings = MethodSettings.for_target(target, quick, real_model=ws.model is not None)
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
