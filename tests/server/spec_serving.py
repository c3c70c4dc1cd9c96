"""Shared by the server tests that speculate: prompts, configs, requests, and plain decoding as the reference."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable

import httpx

from tests.server.conftest import MAX_MODEL_LEN

FAST = {"controller": {"enabled": False, "profile_at_startup": False}}  # no timing-driven choices
NGRAM = {"method": "ngram", "prompt_lookup_min": 1, "prompt_lookup_max": 3}
# Code-like prompts with repeats, so prompt lookup finds drafts even on a random model.
PROMPTS = ["def add(a, b):\n    return a + b\n\ndef add(", "import os\nimport sys\nimport ", "x = [1, 2, 3, 1, 2,",
           "for i in range(10):\n    for j in range(", "class Foo:\n    def", "return self.x + self.",
           "if x is None:\n    x = None\nif y is", "@property\ndef name(self):"]


def plain_decoder(model_dir: Path) -> Callable[[str, int], list[int]]:
    """``plain(prompt, max_tokens)`` -> token ids of plain greedy decoding with ignore_eos (memoised)."""
    from hyspec import LLM, SamplingParams

    llm = LLM(str(model_dir), dtype="float32", backend="cpu", kv_cache_bytes=4 << 20, max_model_len=MAX_MODEL_LEN)
    cache: dict[tuple[str, int], list[int]] = {}

    def plain(prompt: str, max_tokens: int) -> list[int]:
        if (prompt, max_tokens) not in cache:
            (out,) = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True))
            cache[(prompt, max_tokens)] = out.outputs[0].token_ids
        return cache[(prompt, max_tokens)]

    return plain


def hybrid_config(rules: Path, methods: list[Any], **hybrid: Any) -> dict[str, Any]:
    return {"method": "hybrid", "num_speculative_tokens": 3, **FAST,
            "hybrid": {"rules_path": str(rules), "methods": methods, **hybrid}}


def write_rules(path: Path, text: str) -> None:
    """Replace the rule file atomically (a new inode: the dispatcher's stamp changes)."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def complete_raw(client: httpx.Client, prompts: list[str], max_tokens: int) -> dict[str, Any]:
    """One greedy /v1/completions request for ``prompts`` (ignore_eos, token ids returned); the JSON body."""
    r = client.post("/v1/completions", json={"prompt": prompts, "max_tokens": max_tokens, "temperature": 0,
                                             "ignore_eos": True, "return_token_ids": True})
    assert r.status_code == 200, r.text
    body = r.json()
    body["choices"].sort(key=lambda c: c["index"])
    return body


def complete(client: httpx.Client, prompts: list[str], max_tokens: int) -> list[list[int]]:
    return [c["token_ids"] for c in complete_raw(client, prompts, max_tokens)["choices"]]


def complete_checked(client: httpx.Client, plain: Callable[[str, int], list[int]], prompts: list[str],
                     max_tokens: int = 12) -> None:
    """Complete ``prompts`` in one request and demand plain decoding's exact tokens."""
    for prompt, ids in zip(prompts, complete(client, prompts, max_tokens)):
        assert ids == plain(prompt, max_tokens), f"speculation changed the output of {prompt!r}"
