"""Bad checkpoints fail with a message naming the problem (and never unpickle anything)."""
from __future__ import annotations

import json
import shutil

import pytest
from safetensors.torch import load_file, save_file

from hyspec.errors import CheckpointError
from hyspec.model.loader import load_model
from hyspec.model.tokenizer import Tokenizer
from tests.model.tiny_checkpoint import make_checkpoint


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    path = tmp_path_factory.mktemp("good")
    make_checkpoint(path, "qwen2", layers=1)
    return path


def copy(good, tmp_path):
    dst = tmp_path / "ckpt"
    shutil.copytree(good, dst)
    return dst


def test_unsupported_architecture_lists_supported(good, tmp_path):
    d = copy(good, tmp_path)
    cfg = json.loads((d / "config.json").read_text())
    cfg["model_type"] = "gpt_neox"
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=r"gpt_neox.*llama, mistral, qwen2, qwen3"):
        load_model(d)


def test_missing_weights(good, tmp_path):
    d = copy(good, tmp_path)
    (d / "model.safetensors").unlink()
    (d / "pytorch_model.bin").write_bytes(b"pickle bytes that must never be loaded")
    with pytest.raises(CheckpointError, match=r"no \*\.safetensors.*never loads pickled"):
        load_model(d)


def test_truncated_safetensors(good, tmp_path):
    d = copy(good, tmp_path)
    data = (d / "model.safetensors").read_bytes()
    (d / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="model.safetensors.*corrupt or truncated"):
        load_model(d)


def test_missing_shard_of_sharded_checkpoint(good, tmp_path):
    d = copy(good, tmp_path)
    tensors = load_file(d / "model.safetensors")
    names = sorted(tensors)
    half = len(names) // 2
    save_file({n: tensors[n] for n in names[:half]}, d / "model-00001-of-00002.safetensors")
    save_file({n: tensors[n] for n in names[half:]}, d / "model-00002-of-00002.safetensors")
    (d / "model.safetensors").unlink()
    index = {"metadata": {}, "weight_map": {n: f"model-0000{1 if i < half else 2}-of-00002.safetensors"
                                             for i, n in enumerate(names)}}
    (d / "model.safetensors.index.json").write_text(json.dumps(index))
    load_model(d)  # the sharded layout loads
    (d / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(CheckpointError, match="shard model-00002-of-00002.safetensors .* missing"):
        load_model(d)


def test_shape_mismatch_names_the_tensor(good, tmp_path):
    d = copy(good, tmp_path)
    tensors = load_file(d / "model.safetensors")
    name = "model.layers.0.mlp.down_proj.weight"
    tensors[name] = tensors[name][:, :-1].contiguous()
    save_file(tensors, d / "model.safetensors")
    with pytest.raises(CheckpointError, match=r"model\.layers\.0\.mlp\.down_proj\.weight.*shape"):
        load_model(d)


def test_missing_tensor_is_named(good, tmp_path):
    d = copy(good, tmp_path)
    tensors = load_file(d / "model.safetensors")
    del tensors["model.norm.weight"]
    save_file(tensors, d / "model.safetensors")
    with pytest.raises(CheckpointError, match=r"model\.norm\.weight.*missing"):
        load_model(d)


def test_missing_tokenizer(good, tmp_path):
    d = copy(good, tmp_path)
    (d / "tokenizer.json").unlink()
    with pytest.raises(CheckpointError, match="tokenizer.json not found"):
        Tokenizer(d)


def test_bad_config_json(good, tmp_path):
    d = copy(good, tmp_path)
    (d / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="config.json is not valid JSON"):
        load_model(d)
    (d / "config.json").unlink()
    with pytest.raises(CheckpointError, match="config.json not found"):
        load_model(d)


# (Mixtral and Qwen3-MoE load since hyspec.model.moe: tests/model/test_moe.py; the MoE rows here are others)
@pytest.mark.parametrize("model_type, arch", [("gemma", "GemmaForCausalLM"), ("deepseek_v3", "DeepseekV3ForCausalLM"),
                                              ("phimoe", "PhimoeForCausalLM"), ("phi", "PhiForCausalLM")])
def test_architectures_users_bring_are_named_with_the_supported_list(model_type, arch):
    from hyspec.model.config import ModelConfig

    with pytest.raises(CheckpointError, match=rf"unsupported architecture '{model_type}' \(\['{arch}'\]\); "
                                              r"supported model_type values: llama, mistral, qwen2, qwen3"):
        ModelConfig.from_dict({"model_type": model_type, "architectures": [arch]})


def test_a_partial_rotary_factor_is_refused_rather_than_rotating_the_whole_head(good, tmp_path):
    d = copy(good, tmp_path)
    cfg = json.loads((d / "config.json").read_text())
    cfg["partial_rotary_factor"] = 0.5
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="partial_rotary_factor 0.5"):
        load_model(d)
