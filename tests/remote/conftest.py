"""Tiny target + drafters for remote drafting, and a hook that routes draft_placement "remote".

Until the engine's method registry routes ``draft_placement: "remote"`` to
``build_remote_proposer`` itself, :func:`remote_placement` patches the name
the decoder calls; with the registry change in place the patch is a no-op
detour to the same factory.
"""
from __future__ import annotations

import contextlib
import json

import pytest

from tests.model.tiny_checkpoint import make_checkpoint

PROMPTS = ["def add(a, b):", "import os\n", "class Foo:\n    def", "x = [", "return self",
           "for i in range(", "if x is None:\n    ", "@property\ndef name(self):"]
MAX_TOKENS = 40
# The goodput controller reacts to step times (noise on a shared box): off, so every step drafts.
FAST = {"controller": {"enabled": False, "profile_at_startup": False}}


@pytest.fixture(scope="session")
def target_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("remote_target")
    make_checkpoint(path, "llama_gqa", layers=2, seed=0)
    return path


@pytest.fixture(scope="session")
def draft_dir(tmp_path_factory):
    """A smaller random model with the same tokenizer (low acceptance)."""
    path = tmp_path_factory.mktemp("remote_draft")
    make_checkpoint(path, "llama_gqa", layers=1, seed=7)
    return path


@pytest.fixture(scope="session")
def foreign_draft_dir(tmp_path_factory):
    """A drafter built for another target: same shapes, a different tokenizer (two ids swapped)."""
    path = tmp_path_factory.mktemp("remote_foreign")
    make_checkpoint(path, "llama_gqa", layers=1, seed=7)
    tok = json.loads((path / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    a, b = sorted(vocab, key=vocab.get)[100:102]
    vocab[a], vocab[b] = vocab[b], vocab[a]
    (path / "tokenizer.json").write_text(json.dumps(tok))
    return path


@pytest.fixture(scope="session")
def plain_outputs(target_dir):
    from hyspec import LLM, SamplingParams

    llm = LLM(str(target_dir), dtype="float32", kv_cache_bytes=8 << 20)
    outs = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=MAX_TOKENS))
    return [o.outputs[0].token_ids for o in outs]


@contextlib.contextmanager
def remote_placement(make_handles=None, options=None):
    """Build proposers of remote placements with ``build_remote_proposer``.

    ``make_handles(engine, spec)`` supplies the workers (None: Ray).
    """
    import hyspec.spec.decoder as decoder
    from hyspec.remote.factory import build_remote_proposer

    original = decoder.build_proposer

    def build(engine, spec):
        if spec.remote is not None:  # draft_placement "remote"
            handles = make_handles(engine, spec) if make_handles is not None else None
            return build_remote_proposer(engine, spec, options=options, handles=handles)
        return original(engine, spec)

    decoder.build_proposer = build
    try:
        yield
    finally:
        decoder.build_proposer = original


def inprocess_handles(count=1, model_override=None):
    """``make_handles`` for in-process workers (optionally hosting a drafter from ``model_override``)."""
    import dataclasses

    from hyspec.remote.factory import worker_init
    from hyspec.remote.transport import InProcessHandle
    from hyspec.remote.worker import build_host

    def make(engine, spec):
        if model_override is not None:
            spec = dataclasses.replace(spec, model=str(model_override))
        init = worker_init(engine, spec)
        return [InProcessHandle(lambda: build_host(init)) for _ in range(count)]

    return make


def spec_config(method="draft_model", model=None, k=3, remote=None, **top):
    cfg = {**FAST, "method": method, "num_speculative_tokens": k, "draft_placement": "remote", **top}
    if model is not None:
        cfg["model"] = str(model)
    if remote:
        cfg["remote"] = remote
    return cfg


def token_ids(outs):
    return [o.outputs[0].token_ids for o in outs]
