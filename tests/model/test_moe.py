"""Mixtral, Qwen2-MoE and Qwen3-MoE (hyspec.model.moe) against transformers on tiny random checkpoints."""
from __future__ import annotations

import json

import pytest
import torch

from hyspec.errors import CheckpointError, ConfigError
from hyspec.graph_capture import host_read_guard
from hyspec.model.config import ModelConfig
from hyspec.model.loader import load_model
from hyspec.model.moe import SparseMoE
from tests.model.moe_fixtures import MOE_FAMILIES, make_moe_model
from tests.model.paged_decode import greedy_paged

ATOL = 1e-4  # fp32: the same maths in another op order (fused matmuls, grouped experts, paged gather)


@pytest.mark.parametrize("family", sorted(MOE_FAMILIES))
def test_prefill_and_decode_match_transformers(family, tmp_path):
    hf = make_moe_model(family, tmp_path)
    model = load_model(tmp_path, dtype="float32")
    prompt = torch.randint(3, 128, (11,), generator=torch.Generator().manual_seed(1)).tolist()
    tokens, logits = greedy_paged(model, prompt, steps=32, block_size=16)
    full = torch.tensor([prompt + tokens[:-1]])
    with torch.no_grad():
        ref = hf(full).logits[0, len(prompt) - 1:].float()
        gen = hf.generate(torch.tensor([prompt]), max_new_tokens=33, do_sample=False, eos_token_id=None,
                          pad_token_id=0)
    torch.testing.assert_close(logits, ref, atol=ATOL, rtol=1e-4)
    assert tokens == gen[0, len(prompt):].tolist()


def test_dense_forward_matches_transformers(tmp_path):
    hf = make_moe_model("qwen2_moe_b", tmp_path)  # dense and routed layers, a shared expert
    model = load_model(tmp_path, dtype="float32")
    x = torch.randint(3, 128, (2, 17))
    with torch.no_grad():
        ref = hf(x).logits.float()
        out = model.compute_logits(model.forward_dense(x).hidden)
    torch.testing.assert_close(out, ref, atol=ATOL, rtol=1e-4)


def test_routed_and_dense_layers_as_configured(tmp_path):
    make_moe_model("qwen2_moe_b", tmp_path)  # mlp_only_layers [0], three layers
    model = load_model(tmp_path, dtype="float32")
    assert [isinstance(layer.mlp, SparseMoE) for layer in model.layers] == [False, True, True]
    make_moe_model("qwen3_moe_b", tmp_path / "b")  # decoder_sparse_step 2: every second layer routed
    model = load_model(tmp_path / "b", dtype="float32")
    assert [isinstance(layer.mlp, SparseMoE) for layer in model.layers] == [False, True, False]
    assert model.layers[1].mlp.shared_expert is None


@pytest.mark.parametrize("family", ["mixtral_a", "qwen2_moe_a"])
def test_gathered_path_equals_grouped_and_reads_nothing_on_the_host(family, tmp_path):
    """The path captured steps take (no data-dependent shapes) computes what the eager one computes."""
    make_moe_model(family, tmp_path)
    block = load_model(tmp_path, dtype="float32").layers[0].mlp
    x = torch.randn(13, block.gate.in_features)
    with torch.no_grad():
        grouped = block(x)
        block.static_shapes = True
        with host_read_guard():
            gathered = block(x)
    torch.testing.assert_close(gathered, grouped, atol=1e-6, rtol=1e-5)


def _config(tmp_path, **changes) -> dict:
    make_moe_model("qwen2_moe_a", tmp_path)
    d = json.loads((tmp_path / "config.json").read_text())
    d.update(changes)
    return d


def test_unimplemented_moe_options_are_refused_by_name(tmp_path):
    with pytest.raises(CheckpointError, match="use_sliding_window"):
        ModelConfig.from_dict(_config(tmp_path, use_sliding_window=True))
    with pytest.raises(CheckpointError, match="num_experts_per_tok"):
        ModelConfig.from_dict(_config(tmp_path, num_experts_per_tok=9))
    with pytest.raises(CheckpointError, match="hidden_act"):
        ModelConfig.from_dict(_config(tmp_path, hidden_act="gelu"))


def test_missing_expert_tensor_is_named(tmp_path):
    from safetensors.torch import load_file, save_file

    make_moe_model("mixtral_a", tmp_path)
    tensors = load_file(tmp_path / "model.safetensors")
    del tensors["model.layers.1.block_sparse_moe.experts.3.w2.weight"]
    save_file(tensors, tmp_path / "model.safetensors")
    with pytest.raises(CheckpointError, match=r"experts\.3\.w2"):
        load_model(tmp_path, dtype="float32")


def test_demanded_quantization_of_experts_is_refused(tmp_path):
    from hyspec import LLM

    make_moe_model("qwen3_moe_a", tmp_path)
    with pytest.raises(ConfigError, match="routed experts"):
        LLM(str(tmp_path), dtype="float32", backend="cpu", quantization="int8", kv_cache_bytes=4 << 20,
            skip_tokenizer_init=True)


def test_the_cpu_decoder_stack_steps_aside():
    from hyspec.cpu_ops.decoder_stack import unsupported_reason

    torch.manual_seed(0)
    cfg = ModelConfig.from_dict({**MOE_FAMILIES["mixtral_a"][1], "model_type": "mixtral", "vocab_size": 64,
                                 "hidden_size": 64, "intermediate_size": 64, "num_hidden_layers": 1})
    from hyspec.model.moe import MoECausalLM

    assert "MoE" in unsupported_reason(MoECausalLM(cfg, max_positions=32))


@pytest.mark.slow
def test_onnx_export_takes_the_gathered_path_and_matches_torch(tmp_path):
    """Tracing takes the sync-free path, so the exported graph routes every token as torch does."""
    pytest.importorskip("onnxruntime")
    from hyspec.cpu_ops.onnx_check import check_against_torch
    from hyspec.cpu_ops.onnx_drafter import OnnxDraftModel, export_draft_model

    make_moe_model("qwen2_moe_a", tmp_path)
    onnx = OnnxDraftModel(export_draft_model(tmp_path), num_threads=1)
    check = check_against_torch(load_model(tmp_path, dtype="float32"), onnx, [[5, 9, 14, 3, 7, 22], [8, 8, 30]],
                                steps=6)
    assert check.worst_ratio <= 1.0 and check.compared_rows > 0, check
