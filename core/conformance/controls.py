"""Sampling controls under every method at temperature 0: the tokens must be plain decoding's.

For each method (the conformance suite's list, random drafters on the tiny target) and each
control (a penalty, ``logit_bias``, ``min_tokens``, ``allowed_token_ids``), a ragged batch is
decoded greedily with the control, plainly and with the method, and compared token for token.
Each control is chosen so that it changes plain decoding's output (reported as ``changed``):
an identity that a control never touched would prove nothing.
"""
from __future__ import annotations

import logging
from collections import Counter
from typing import Any

from hyspec import LLM, SamplingParams
from hyspec.conformance.methods import CONTROLLER_OFF, Workspace, method_config

#: the controls every method is checked with; min_tokens and logit_bias are made to bite from the
#: uncontrolled output (control_params)
CONTROL_NAMES = ("repetition_penalty", "presence_penalty", "frequency_penalty", "logit_bias", "min_tokens",
                 "allowed_token_ids")


def control_params(name: str, plain: list[list[int]], vocab_size: int) -> dict[str, Any]:
    """The SamplingParams fields of control ``name``, from the uncontrolled greedy outputs ``plain``."""
    early = Counter(t for out in plain for t in out[:6]).most_common()
    if name == "repetition_penalty":
        return {"repetition_penalty": 1.5}
    if name == "presence_penalty":
        return {"presence_penalty": 1.5}
    if name == "frequency_penalty":
        return {"frequency_penalty": 1.0}
    if name == "logit_bias":  # push the most common early tokens down and a few others up
        return {"logit_bias": {**{t: 4.0 for t in range(3, vocab_size, 37)}, **{t: -5.0 for t, _ in early[:3]}}}
    if name == "min_tokens":  # a token plain decoding emits early becomes a stop token, held back for 12 tokens
        return {"min_tokens": 12, "stop_token_ids": [early[0][0]], "ignore_eos": False}
    if name == "allowed_token_ids":  # every third token, the most common early ones excluded
        banned = {t for t, _ in early[:3]}
        return {"allowed_token_ids": [t for t in range(0, vocab_size, 3) if t not in banned]}
    raise ValueError(f"unknown control {name!r}")


def _greedy(llm: LLM, batch: list[list[int]], max_tokens: int, **fields: Any) -> list[list[int]]:
    params = SamplingParams(**{"temperature": 0, "max_tokens": max_tokens, "ignore_eos": True, **fields})
    return [o.outputs[0].token_ids for o in llm.generate([list(p) for p in batch], params)]


def engine(ws: Workspace, spec: dict[str, Any] | None = None) -> LLM:
    return LLM(str(ws.target_dir), dtype="float32", kv_cache_bytes=32 << 20, max_model_len=256,
               speculative_config=None if spec is None else {**CONTROLLER_OFF, **spec})


def control_matrix(ws: Workspace, methods: list[str], num_prompts: int = 4, max_tokens: int = 24,
                   controls: tuple[str, ...] = CONTROL_NAMES) -> list[dict[str, Any]]:
    """One row per (method, control): identical to plain, whether the control changed plain's output,
    how many prompts match, and the method's draft / accepted tokens under the control."""
    batch = ws.prompts(num_prompts)
    plain_llm = engine(ws)
    vocab = plain_llm.engine.config.vocab_size
    uncontrolled = _greedy(plain_llm, batch, max_tokens)
    fields = {name: control_params(name, uncontrolled, vocab) for name in controls}
    expected = {name: _greedy(plain_llm, batch, max_tokens, **f) for name, f in fields.items()}
    quality = logging.getLogger("hyspec.spec.quality")
    level = quality.level
    quality.setLevel(logging.ERROR)  # random drafters are rejected on purpose
    rows = []
    try:
        for method in methods:
            llm = engine(ws, method_config(method, ws))
            try:
                for name in controls:
                    before = llm.engine.spec.metrics.snapshot()["totals"]
                    got = _greedy(llm, batch, max_tokens, **fields[name])
                    after = llm.engine.spec.metrics.snapshot()["totals"]
                    rows.append({
                        "method": method, "control": name,
                        "identical": got == expected[name],
                        "prompts_identical": sum(a == b for a, b in zip(got, expected[name])),
                        "prompts": len(batch),
                        "changed_vs_uncontrolled": sum(a != b for a, b in zip(expected[name], uncontrolled)),
                        "draft_tokens": after["draft_tokens"] - before["draft_tokens"],
                        "accepted_tokens": after["accepted_tokens"] - before["accepted_tokens"],
                    })
            finally:
                llm.engine.spec.close()
    finally:
        quality.setLevel(level)
    return rows
