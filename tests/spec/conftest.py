from __future__ import annotations

import pytest

from tests.model.tiny_checkpoint import make_checkpoint

PROMPTS = ["def add(a, b):", "import os\n", "class Foo:\n    def", "x = [", "return self",
           "for i in range(", "if x is None:\n    ", "@property\ndef name(self):"]


@pytest.fixture(scope="session")
def target_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("spec_target")
    make_checkpoint(path, "llama_gqa", layers=2, seed=0)
    return path


@pytest.fixture(scope="session")
def draft_dir(tmp_path_factory):
    """A different, smaller random model with the same tokenizer."""
    path = tmp_path_factory.mktemp("spec_draft")
    make_checkpoint(path, "llama_gqa", layers=1, seed=7)
    return path


@pytest.fixture(scope="session")
def plain_outputs(target_dir):
    """Greedy plain-decoding reference for PROMPTS (60 tokens each)."""
    from hyspec import LLM, SamplingParams

    llm = LLM(str(target_dir), dtype="float32", kv_cache_bytes=8 << 20)
    outs = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=60))
    return [o.outputs[0].token_ids for o in outs]
