from __future__ import annotations

import pytest

from tests.model.tiny_checkpoint import make_checkpoint


@pytest.fixture(scope="session")
def tiny_ckpt(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny_llama")
    hf = make_checkpoint(path, "llama_gqa")
    return path, hf


@pytest.fixture(scope="session")
def tiny_llm(tiny_ckpt):
    from hyspec import LLM

    return LLM(str(tiny_ckpt[0]), dtype="float32", kv_cache_bytes=8 << 20)
