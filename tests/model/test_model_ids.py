"""Hub ids (``org/name``) resolve from a local Hugging Face cache built here, never from the network."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hyspec.errors import CheckpointError
from hyspec.model.hub import looks_like_model_id, resolve_model
from tests.model.hf_fixtures import make_hf_model

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def _cache_repo(hub: Path, repo_id: str, fill) -> Path:
    """The layout huggingface_hub writes: models--org--name/{refs/main, snapshots/<commit>/...}."""
    repo = hub / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / COMMIT
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    fill(snapshot)
    return snapshot


@pytest.fixture
def hub(tmp_path, monkeypatch):
    """An empty cache that huggingface_hub (already imported) looks in, as HF_HUB_CACHE would make it."""
    from huggingface_hub import constants

    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    return cache


def test_a_cached_id_resolves_to_its_snapshot_and_llm_loads_it(hub, tmp_path):
    from hyspec.engine.llm import LLM
    from hyspec.engine.sampling_params import SamplingParams

    snapshot = _cache_repo(hub, "tiny-org/tiny-llama", lambda p: make_hf_model("llama_gqa", p))
    assert resolve_model("tiny-org/tiny-llama") == snapshot
    assert resolve_model(f"tiny-org/tiny-llama@{COMMIT}") == snapshot
    args = dict(dtype="float32", backend="cpu", kv_cache_bytes=4 << 20, max_model_len=128, skip_tokenizer_init=True)
    params = SamplingParams(max_tokens=8, temperature=0.0)
    with LLM(model="tiny-org/tiny-llama", **args) as by_id:
        assert by_id.engine.model_path == snapshot and by_id.engine.model_id == "tiny-org/tiny-llama"
        tokens = by_id.generate([[5, 9, 17, 33]], params)[0].outputs[0].token_ids
    with LLM(model=str(snapshot), **args) as by_path:
        assert by_path.generate([[5, 9, 17, 33]], params)[0].outputs[0].token_ids == tokens


def test_an_uncached_id_names_the_cache_folder_looked_at(hub):
    with pytest.raises(CheckpointError) as err:
        resolve_model("Qwen/Qwen3-0.6B")
    message = str(err.value)
    assert str(hub / "models--Qwen--Qwen3-0.6B") in message and "never downloads" in message


def test_a_gguf_repository_resolves_to_its_one_gguf_file(hub):
    snapshot = _cache_repo(hub, "org/model-GGUF", lambda p: (p / "model-Q4_0.gguf").write_bytes(b"GGUF"))
    assert resolve_model("org/model-GGUF") == snapshot / "model-Q4_0.gguf"
    (snapshot / "model-Q8_0.gguf").write_bytes(b"GGUF")
    with pytest.raises(CheckpointError, match="2 GGUF files"):
        resolve_model("org/model-GGUF")


def test_existing_paths_stay_paths(tmp_path, monkeypatch):
    (tmp_path / "org" / "name").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    assert not looks_like_model_id("org/name")  # a relative directory that exists wins over the Hub id
    assert resolve_model("org/name") == Path("org/name")
    assert not looks_like_model_id("/abs/path") and not looks_like_model_id("./rel/x")
    assert not looks_like_model_id("models/missing.gguf")  # a missing file keeps the loader's own message
    assert looks_like_model_id("org/other") and looks_like_model_id("Qwen/Qwen3-0.6B@main")


def test_hf_home_from_the_environment_is_where_the_id_is_found(tmp_path):
    """The process's HF_HOME (read by huggingface_hub at import, as in a served process) decides the cache."""
    snapshot = _cache_repo(tmp_path / "home" / "hub", "org/tiny",
                           lambda p: (p / "config.json").write_text(json.dumps({"model_type": "llama"})))
    env = {**os.environ, "HF_HOME": str(tmp_path / "home"), "HF_HUB_OFFLINE": "1"}
    env.pop("HF_HUB_CACHE", None)
    code = "from hyspec.model.hub import resolve_model; print(resolve_model('org/tiny'))"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert Path(out.stdout.strip()) == snapshot


def _word_tokenizer(path: Path, vocab: int = 128) -> None:
    """A whole-word tokenizer over the tiny vocabulary: enough for the server, no training."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = {"<pad>": 0, "<s>": 1, "</s>": 2, **{f"w{i}": i for i in range(3, vocab)}}
    tok = Tokenizer(models.WordLevel(words, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>", "eos_token": "</s>",
                                                            "pad_token": "<pad>"}))


def test_the_server_answers_to_the_id(hub):
    pytest.importorskip("fastapi")
    from hyspec.engine.engine import LLMEngine
    from hyspec.server.app import create_app

    _cache_repo(hub, "tiny-org/served", lambda p: (make_hf_model("llama_gqa", p), _word_tokenizer(p)))
    engine = LLMEngine("tiny-org/served", dtype="float32", backend="cpu", kv_cache_bytes=4 << 20, max_model_len=64)
    assert create_app(engine).state.served_model_name == "tiny-org/served"
