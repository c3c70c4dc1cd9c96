"""hyspec export-hf: a GGUF written as a Hugging Face directory holds the same model, tokenizer and template."""
from __future__ import annotations

import pytest
import torch
from hyspec.cli.main import main
from hyspec.errors import HyspecError
from hyspec.model.config import ModelConfig
from hyspec.model.export_hf import export_hf
from hyspec.model.loader import load_model
from hyspec.model.tokenizer import Tokenizer

from tests.model.gguf_fixtures import make_source_checkpoint, write_gguf

pytest.importorskip("gguf")
pytest.importorskip("transformers")

IDS = torch.arange(3, 318, 5)[None]
CONFIG_FIELDS = ("model_type", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                 "num_attention_heads", "num_key_value_heads", "head_dim", "tie_word_embeddings", "qkv_bias",
                 "max_position_embeddings", "rope", "qk_norm", "rms_norm_eps")


def _logits(model) -> torch.Tensor:
    return model.compute_logits(model.forward_dense(IDS).hidden[0])


@pytest.fixture(scope="module")
def gguf_files(tmp_path_factory):
    root = tmp_path_factory.mktemp("export")
    out = {}
    for arch in ("llama", "qwen2"):  # untied with llama.cpp's q/k row order; tied with qkv bias
        src = root / f"src-{arch}"
        make_source_checkpoint(src, arch)
        out[arch] = write_gguf(src, root / f"{arch}.gguf", "Q8_0", arch)
    return out


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_exported_directory_is_the_same_model(tmp_path, gguf_files, arch):
    gguf_file = gguf_files[arch]
    out = export_hf(gguf_file, tmp_path / "hf")
    assert (out / "model.safetensors").is_file() and (out / "config.json").is_file()
    got, ref = ModelConfig.from_pretrained(out), ModelConfig.from_pretrained(gguf_file)
    for name in CONFIG_FIELDS:
        assert getattr(got, name) == getattr(ref, name), name
    # The dequantized values in the same modules: the logits match to the bit.
    assert torch.equal(_logits(load_model(out, dtype="float32")), _logits(load_model(gguf_file, dtype="float32")))
    a, b = Tokenizer(out), Tokenizer(gguf_file)
    for text in ["def f(x):\n    return x + 1", "  tabs\tand ünïcödé"]:
        assert a.encode(text) == b.encode(text)
    msgs = [{"role": "user", "content": "hi"}]
    assert a.apply_chat_template(msgs) == b.apply_chat_template(msgs)


def test_cli_writes_and_never_overwrites(tmp_path, gguf_files, capsys):
    out = tmp_path / "hf"
    assert main(["export-hf", str(out), "--model", str(gguf_files["llama"]), "--dtype", "bfloat16"]) == 0
    assert ModelConfig.from_pretrained(out).torch_dtype == "bfloat16"
    before = sorted(p.name for p in out.iterdir())
    assert main(["export-hf", str(out), "--model", str(gguf_files["llama"])]) == 2
    assert "exists and is not an empty directory" in capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == before  # nothing lost or half-written
    assert [p.name for p in tmp_path.iterdir()] == ["hf"]  # no staging directory left behind


def test_bad_input_is_named(tmp_path):
    with pytest.raises(HyspecError, match="not a .gguf file"):
        export_hf(tmp_path, tmp_path / "out")
    with pytest.raises(HyspecError, match="--dtype 'int8'"):
        export_hf(tmp_path / "m.gguf", tmp_path / "out", dtype="int8")
