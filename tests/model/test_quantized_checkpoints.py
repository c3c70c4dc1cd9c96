"""Checkpoints that say they are quantized: FP8 scales applied at load, every other method refused by name.

Before this (main at 7185667) an FP8 checkpoint's weights were cast to the compute dtype without their
scales and the scales dropped with a warning "ignoring N tensors": these tests fail there.
"""
from __future__ import annotations

import json
import logging

import pytest
import torch

from hyspec.errors import CheckpointError
from hyspec.model.checkpoint_quant import dequantize_fp8
from hyspec.model.loader import load_model
from tests.model.fp8_fixtures import quantize_fp8, write_fp8_checkpoint
from tests.model.hf_fixtures import make_hf_model
from tests.model.paged_decode import greedy_paged


def _deepseek_reference_dequant(q: torch.Tensor, s: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    """DeepSeek-V3's published rule (inference/kernel.py weight_dequant, d4c8543): element (i, j) times the
    scale of its block (i // b0, j // b1), edge blocks partial; written element-wise as the definition."""
    out = torch.empty(q.shape)
    qf = q.float()
    for i in range(q.shape[0]):
        for j in range(q.shape[1]):
            out[i, j] = qf[i, j] * s[i // block[0], j // block[1]]
    return out


def test_block_dequantization_matches_the_published_rule_with_partial_edge_blocks():
    w = torch.randn(20, 36)
    q, s = quantize_fp8(w, "block", (8, 16))  # 20 = 2.5 row blocks, 36 = 2.25 column blocks
    assert s.shape == (3, 3)
    got = dequantize_fp8(q, s, (8, 16), "w")
    torch.testing.assert_close(got, _deepseek_reference_dequant(q, s, (8, 16)), rtol=0, atol=0)
    assert (got - w).abs().max() < 0.07 * w.abs().max()  # e4m3 keeps 3 mantissa bits


def test_block_fp8_qwen3_matches_transformers_dequantized_load(tmp_path, caplog):
    """transformers without an FP8 GPU dequantizes FineGrainedFP8 checkpoints (weight * weight_scale_inv per
    block): the same model, so logits agree at fp32 rounding and greedy tokens exactly."""
    import transformers

    make_hf_model("qwen3", tmp_path / "dense", intermediate_size=128)
    write_fp8_checkpoint(tmp_path / "dense", tmp_path / "fp8", "block", (32, 32))
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "fp8", dtype=torch.float32).eval()
    with caplog.at_level(logging.WARNING, logger="hyspec"):
        model = load_model(tmp_path / "fp8", dtype="float32")
    assert not [r for r in caplog.records if "ignoring" in r.getMessage()], "scales must not be 'ignored'"
    prompt = [5, 17, 33, 9, 60, 2, 44]
    tokens, logits = greedy_paged(model, prompt, steps=24, block_size=16)
    with torch.no_grad():
        ref = hf(torch.tensor([prompt + tokens[:-1]])).logits[0, len(prompt) - 1:].float()
    torch.testing.assert_close(logits, ref, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("layout", ["block", "tensor", "channel"])
def test_every_fp8_layout_loads_weight_times_scale(layout, tmp_path):
    """Per block with partial edge blocks (intermediate 136 = 4.25 blocks of 32), per tensor (vLLM / AutoFP8,
    with a static input_scale that is read and not applied) and per channel (compressed-tensors)."""
    dense = make_hf_model("qwen3", tmp_path / "dense")
    write_fp8_checkpoint(tmp_path / "dense", tmp_path / "fp8", layout, (32, 32))
    model = load_model(tmp_path / "fp8", dtype="float32")
    src = dense.model.layers[1].mlp.down_proj.weight.detach()
    q, s = quantize_fp8(src, layout, (32, 32))
    expected = q.float() * (s if layout != "block" else
                            s.repeat_interleave(32, 0)[:q.shape[0]].repeat_interleave(32, 1)[:, :q.shape[1]])
    torch.testing.assert_close(model.layers[1].mlp.down_proj.weight, expected, rtol=0, atol=0)
    # and the dequantized model is the dense one up to FP8 rounding, not a scale-free cast of the codes
    ids = torch.tensor([[5, 17, 33, 9, 60, 2, 44, 8]])
    with torch.no_grad():
        ref = dense(ids).logits[0]
    got = model.compute_logits(model.forward_dense(ids).hidden[0])
    assert (got - ref).abs().max() < 0.1 * ref.abs().max()


def _with_quantization(tmp_path, qc):
    make_hf_model("qwen3", tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["quantization_config"] = qc
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    return tmp_path


@pytest.mark.parametrize("qc, named", [
    ({"quant_method": "gptq", "bits": 4, "group_size": 128}, "GPTQ"),
    ({"quant_method": "awq", "bits": 4, "version": "gemm"}, "AWQ"),
    ({"quant_method": "bitsandbytes", "load_in_4bit": True}, "bitsandbytes"),
    ({"quant_method": "compressed-tensors", "format": "pack-quantized",
      "config_groups": {"g": {"weights": {"num_bits": 4, "type": "int", "strategy": "group"}}}}, "pack-quantized"),
    ({"quant_method": "compressed-tensors", "format": "float-quantized",
      "config_groups": {"g": {"weights": {"num_bits": 4, "type": "float", "strategy": "tensor"}}}}, "4-bit float"),
    ({"quant_method": "fp8", "fmt": "e5m2"}, "e5m2"),
    ({"quant_method": "some_new_method"}, "some_new_method"),
])
def test_other_quantization_methods_are_refused_by_name(qc, named, tmp_path):
    path = _with_quantization(tmp_path, qc)
    with pytest.raises(CheckpointError, match=named) as err:
        load_model(path, dtype="float32")
    assert "GGUF" in str(err.value) and "missing" not in str(err.value)


def test_fp8_tensors_without_a_quantization_config_are_refused(tmp_path):
    make_hf_model("qwen3", tmp_path / "dense")
    write_fp8_checkpoint(tmp_path / "dense", tmp_path / "fp8", "block")
    cfg = json.loads((tmp_path / "fp8" / "config.json").read_text())
    del cfg["quantization_config"]
    (tmp_path / "fp8" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="no quantization_config"):
        load_model(tmp_path / "fp8", dtype="float32")


def test_an_fp8_weight_without_its_scale_is_refused(tmp_path):
    from safetensors.torch import load_file, save_file

    make_hf_model("qwen3", tmp_path / "dense")
    write_fp8_checkpoint(tmp_path / "dense", tmp_path / "fp8", "block")
    file = tmp_path / "fp8" / "model.safetensors"
    tensors = load_file(str(file))
    del tensors["model.layers.0.self_attn.k_proj.weight_scale_inv"]
    save_file(tensors, str(file))
    with pytest.raises(CheckpointError, match="k_proj.weight_scale_inv"):
        load_model(tmp_path / "fp8", dtype="float32")
