"""Sampling controls and a JSON schema under every method, on the default model with its trained drafters.

The tiny-target matrix (hyspec.conformance.controls) runs random drafters whose drafts are mostly
rejected, so it shows the controls at the verified root row only.  This one runs ``LLM()``'s default
target (SmolLM2-135M-Instruct from its GGUF) with the drafters committed in ``assets/``: drafts are
accepted, and each control then acts on rows that follow accepted drafts of the same step.

Per method, ONE batch holds every control's requests (each prompt once per control, a request's own
``SamplingParams``), decoded greedily and compared token for token with plain decoding of the same batch.
Rows of different controls verified in one call also show that a request's processors stay its own.
Each cell records the draft tokens verified for its requests and those accepted
(``RequestOutput.metrics``), and whether the control changed plain decoding's output.
"""
from __future__ import annotations

import json
import logging
import time
from typing import Any, Callable

from hyspec import LLM, SamplingParams, StructuredOutputsParams
from hyspec.bench.prompts import CHAT_PROMPTS, humaneval_prompts
from hyspec.conformance.controls import CONTROL_NAMES, control_params
from hyspec.conformance.methods import CONTROLLER_OFF

#: every method with a drafter for the default model (assets/), the weightless ones, and the hybrid over them
REAL_METHODS = ("ngram", "suffix", "eagle", "eagle3", "mtp", "draft_model", "dflash", "dspark", "hybrid")
UNCONTROLLED = "none"
JSON_SCHEMA_CONTROL = "json_schema"
REAL_CONTROLS = (UNCONTROLLED, *CONTROL_NAMES, JSON_SCHEMA_CONTROL)
#: an object every prompt can be answered with (a function's or a topic's name, a summary, a few points)
JSON_SCHEMA = {"type": "object",
               "properties": {"name": {"type": "string"}, "summary": {"type": "string"},
                              "points": {"type": "array", "items": {"type": "string"}, "maxItems": 3}},
               "required": ["name", "summary"]}
#: prompt lookup from a single matching token: the prompts here repeat little, and drafts must be accepted
METHOD_OPTIONS: dict[str, dict[str, Any]] = {"ngram": {"prompt_lookup_min": 1, "prompt_lookup_max": 3}}
HUMANEVAL_PICKS = (0, 2)  # has_close_elements, truncate_number: raw code completion
CHAT_PICKS = (0, 2)  # the prime checker, list vs tuple: through the chat template


def real_prompts(llm: LLM) -> list[list[int]]:
    """Two HumanEval heads as raw text and two chat questions through the model's chat template."""
    tok = llm.tokenizer
    humaneval = humaneval_prompts()
    code = [tok.encode(humaneval[i]) for i in HUMANEVAL_PICKS]
    chats = [tok.apply_chat_template([{"role": "user", "content": CHAT_PROMPTS[i]}], add_generation_prompt=True)
             for i in CHAT_PICKS]
    return code + [tok.encode(text, add_special_tokens=False) for text in chats]


def control_fields(controls: tuple[str, ...], uncontrolled: list[list[int]], vocab_size: int) -> dict[str, dict]:
    """Each control's SamplingParams fields (the tiny matrix's, made to bite from ``uncontrolled``)."""
    fields: dict[str, dict] = {}
    for name in controls:
        if name == UNCONTROLLED:
            fields[name] = {}
        elif name == JSON_SCHEMA_CONTROL:  # the grammar ends the output with end-of-sequence: no ignore_eos
            fields[name] = {"structured_outputs": StructuredOutputsParams(json=JSON_SCHEMA), "ignore_eos": False}
        else:
            fields[name] = control_params(name, uncontrolled, vocab_size)
    return fields


def _params(fields: dict, max_tokens: int) -> SamplingParams:
    return SamplingParams(**{"temperature": 0, "max_tokens": max_tokens, "ignore_eos": True, **fields})


def _run(llm: LLM, batch: list[list[int]], fields: dict[str, dict], max_tokens: int):
    """Every control's requests in one generate call: {control: [RequestOutput per prompt]}."""
    names = list(fields)
    prompts = [{"prompt_token_ids": list(p)} for _ in names for p in batch]
    params = [_params(fields[n], max_tokens) for n in names for _ in batch]
    outs = llm.generate(prompts, params)
    return {n: outs[i * len(batch):(i + 1) * len(batch)] for i, n in enumerate(names)}


def _json_validity(llm: LLM, outputs: list[list[int]]) -> dict[str, int]:
    """How many outputs ended (end-of-sequence) and how many of those the schema accepts."""
    import jsonschema

    ended = valid = 0
    for ids in outputs:
        if not ids or ids[-1] not in llm.engine.eos_ids:
            continue
        ended += 1
        try:
            jsonschema.validate(json.loads(llm.tokenizer.decode(ids[:-1])), JSON_SCHEMA)
            valid += 1
        except (ValueError, jsonschema.ValidationError):
            pass
    return {"ended": ended, "valid": valid}


def real_control_matrix(methods: tuple[str, ...] = REAL_METHODS, controls: tuple[str, ...] = REAL_CONTROLS,
                        max_tokens: int = 40, on_method: Callable[[dict[str, Any]], None] | None = None,
                        ) -> dict[str, Any]:
    """Plain decoding's reference, then one row per (method, control); ``on_method(partial result)`` after
    each method (for writing results as they come)."""
    plain_llm = LLM()
    try:
        batch = real_prompts(plain_llm)
        vocab = plain_llm.engine.config.vocab_size
        started = time.perf_counter()
        uncontrolled = [o.outputs[0].token_ids for o in plain_llm.generate(
            [{"prompt_token_ids": list(p)} for p in batch], _params({}, max_tokens))]
        fields = control_fields(controls, uncontrolled, vocab)
        plain = _run(plain_llm, batch, fields, max_tokens)
        plain_seconds = time.perf_counter() - started
        expected = {n: [o.outputs[0].token_ids for o in outs] for n, outs in plain.items()}
        plain_rows = {n: {
            "changed_vs_uncontrolled": sum(a != b for a, b in zip(expected[n], uncontrolled)),
            "finish_reasons": [o.outputs[0].finish_reason for o in outs],
            "output_tokens": [len(t) for t in expected[n]],
            **({"json": _json_validity(plain_llm, expected[n])} if n == JSON_SCHEMA_CONTROL else {}),
        } for n, outs in plain.items()}
        texts = {n: [plain_llm.tokenizer.decode(t) for t in expected[n]] for n in expected}
    finally:
        plain_llm.close()
    result: dict[str, Any] = {
        "prompts": len(batch), "prompt_tokens": [len(p) for p in batch], "max_tokens": max_tokens,
        "controls": list(controls), "fields": {n: _describe(f) for n, f in fields.items()},
        "plain": {"seconds": round(plain_seconds, 1), "cells": plain_rows, "texts": texts},
        "methods": {}, "rows": []}
    quality = logging.getLogger("hyspec.spec.quality")
    level = quality.level
    quality.setLevel(logging.ERROR)  # early drafters are flagged as weak: known, and not this run's subject
    try:
        for method in methods:
            result["rows"].extend(_method_rows(method, batch, fields, expected, result))
            if on_method is not None:
                on_method(result)
    finally:
        quality.setLevel(level)
    result["all_identical"] = all(r.get("identical") is True for r in result["rows"])
    return result


def _method_rows(method: str, batch, fields, expected, result) -> list[dict[str, Any]]:
    started = time.perf_counter()
    try:
        llm = LLM(speculative_config={**CONTROLLER_OFF, "method": method, **METHOD_OPTIONS.get(method, {})})
    except Exception as exc:  # a method that does not start is its own row, the others still run
        result["methods"][method] = {"error": f"{type(exc).__name__}: {exc}"}
        return [{"method": method, "control": n, "identical": None, "error": f"{type(exc).__name__}: {exc}"}
                for n in fields]
    try:
        try:
            got = _run(llm, batch, fields, result["max_tokens"])
            failures: dict[str, str] = {}
        except Exception:  # find the control that is refused, one at a time
            got, failures = {}, {}
            for n, f in fields.items():
                try:
                    got.update(_run(llm, batch, {n: f}, result["max_tokens"]))
                except Exception as exc:
                    failures[n] = f"{type(exc).__name__}: {exc}"
        snap = llm.engine.spec.metrics.snapshot()
    finally:
        llm.close()
    result["methods"][method] = {
        "seconds": round(time.perf_counter() - started, 1),
        "steps_by_method": {m: {arm: {k: s[k] for k in ("steps", "draft_tokens", "accepted_tokens")}
                                for arm, s in arms.items()} for m, arms in snap["methods"].items()}}
    rows = []
    for n in fields:
        if n in failures:
            rows.append({"method": method, "control": n, "identical": None, "error": failures[n]})
            continue
        tokens = [o.outputs[0].token_ids for o in got[n]]
        rows.append({
            "method": method, "control": n, "identical": tokens == expected[n],
            "prompts_identical": sum(a == b for a, b in zip(tokens, expected[n])), "prompts": len(batch),
            "changed_vs_uncontrolled": result["plain"]["cells"][n]["changed_vs_uncontrolled"],
            "draft_tokens": sum(o.metrics.num_draft_tokens for o in got[n]),
            "accepted_tokens": sum(o.metrics.num_accepted_tokens for o in got[n]),
            "accepted_per_prompt": [o.metrics.num_accepted_tokens for o in got[n]],
            "first_difference": _first_differences(tokens, expected[n]),
        })
    return rows


def _first_differences(got: list[list[int]], want: list[list[int]]) -> list[int | None]:
    """Per prompt: the index of the first differing token (None where identical)."""
    out: list[int | None] = []
    for a, b in zip(got, want):
        if a == b:
            out.append(None)
        else:
            out.append(next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b))))
    return out


def _describe(fields: dict) -> dict:
    """The control's fields as JSON (logit_bias summarised: it lists over a thousand token ids)."""
    out: dict[str, Any] = {}
    for key, value in fields.items():
        if key == "logit_bias":
            ups = sorted(t for t, b in value.items() if b > 0)
            out[key] = {"+4 on every 37th id from 3": len(ups), "-5 on": sorted(t for t, b in value.items() if b < 0)}
        elif key == "allowed_token_ids":
            out[key] = f"{len(value)} ids: every third, the three most common early tokens left out"
        elif key == "structured_outputs":
            out[key] = {"json": JSON_SCHEMA}
        else:
            out[key] = value
    return out
