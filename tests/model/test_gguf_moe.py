"""Mixtral, Qwen2-MoE and Qwen3-MoE through GGUF files written as llama.cpp's converter writes them
(tests.model.gguf_moe_fixtures): the file gives the source checkpoint's logits and greedy tokens, and the source
checkpoint is transformers' model.  What the file cannot say (``norm_topk_prob``) is read as llama.cpp reads it;
what hyspec does not run is refused by name."""
from __future__ import annotations

import pytest
import torch

from hyspec.errors import CheckpointError
from hyspec.model.config import ModelConfig
from hyspec.model.loader import load_model
from hyspec.model.moe import SparseMoE
from tests.model.gguf_moe_fixtures import write_moe_gguf
from tests.model.moe_fixtures import make_moe_checkpoint
from tests.model.paged_decode import greedy_paged

IDS = torch.arange(3, 318, 5)[None]  # 64 positions
PROMPT = [5, 17, 203, 44, 9, 120, 77, 301, 12, 60, 8]
#: name -> (tests.model.moe_fixtures family, changes): widths multiples of 32 (Q8_0 blocks), and the
#: renormalisation llama.cpp fixes for the architecture (Qwen2-MoE never, Mixtral and Qwen3-MoE always)
SOURCES = {
    "mixtral": ("mixtral_a", dict(intermediate_size=96)),
    "qwen2_moe": ("qwen2_moe_a", dict(intermediate_size=96, moe_intermediate_size=32,
                                      shared_expert_intermediate_size=64)),
    "qwen3_moe": ("qwen3_moe_a", dict(intermediate_size=96)),
    # dense layers 0 and 2 (decoder_sparse_step 2), top-1 of 5, tied embeddings
    "qwen3_moe_mixed": ("qwen3_moe_b", dict(intermediate_size=96, moe_intermediate_size=64, norm_topk_prob=True)),
}
#: Q8_0 against transformers on the unrounded weights: every matrix but the routers (F32, as llama.cpp keeps
#: them) rounded to 8 bits per 32-value block, which also moves the router's input, so a token near a routing
#: tie can change experts.  Measured at most 9.5e-3 on these sources (largest |logit| 0.64 to 1.13)
Q8_0_VS_FP32 = 3e-2


def _source(name: str, path):
    family, changes = SOURCES[name]
    return make_moe_checkpoint(path, family, seed=3, **changes)


def _logits(model) -> torch.Tensor:
    with torch.no_grad():
        return model.compute_logits(model.forward_dense(IDS).hidden)[0]


@pytest.mark.parametrize("name", sorted(SOURCES))
@pytest.mark.parametrize("qtype", ["F32", "Q8_0"])
def test_round_trip_gives_the_source_checkpoints_logits_and_tokens(name, qtype, tmp_path):
    src = tmp_path / "src"
    hf = _source(name, src)
    gguf_file = write_moe_gguf(src, tmp_path / f"{name}.gguf", qtype)
    cfg_dir, cfg_gguf = ModelConfig.from_pretrained(src), ModelConfig.from_pretrained(gguf_file)
    for field in ("model_type", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                  "num_attention_heads", "num_key_value_heads", "head_dim", "tie_word_embeddings", "rope",
                  "qkv_bias", "qk_norm", "layer_windows", "moe"):
        assert getattr(cfg_gguf, field) == getattr(cfg_dir, field), field
    source, model = load_model(src, dtype="float32"), load_model(gguf_file, dtype="float32")
    # the same values (q/k rows un-permuted exactly): only the op order of two loads could differ
    torch.testing.assert_close(_logits(model), _logits(source), atol=1e-5, rtol=1e-5)
    ref_tokens, ref_logits = greedy_paged(source, PROMPT, steps=24)
    tokens, logits = greedy_paged(model, PROMPT, steps=24)
    torch.testing.assert_close(logits, ref_logits, atol=1e-5, rtol=1e-5)
    assert tokens == ref_tokens
    with torch.no_grad():
        expected = hf(IDS).logits[0].float()  # transformers on the unrounded weights
    if qtype == "F32":
        torch.testing.assert_close(_logits(model), expected, atol=1e-4, rtol=1e-4)
    else:
        assert float((_logits(model) - expected).abs().max()) <= Q8_0_VS_FP32


def test_layers_without_a_router_are_dense(tmp_path):
    """llama.cpp's qwen*moe graphs want a router on every layer; the converter still writes a dense layer's
    MLP under the dense names, and hyspec reads it as the dense layer it was."""
    _source("qwen3_moe_mixed", tmp_path / "src")
    model = load_model(write_moe_gguf(tmp_path / "src", tmp_path / "m.gguf", "F32"), dtype="float32")
    assert [isinstance(layer.mlp, SparseMoE) for layer in model.layers] == [False, True, False]


@pytest.mark.parametrize(("name", "renormalised"), [("qwen2_moe", False), ("qwen3_moe", True), ("mixtral", True)])
def test_norm_topk_prob_is_read_as_llama_cpp_fixes_it(name, renormalised, tmp_path):
    """The converter does not write norm_topk_prob: a source that disagrees with llama.cpp's fixed choice
    cannot survive the conversion, and the file is read the way llama.cpp runs it."""
    family, changes = SOURCES[name]
    make_moe_checkpoint(tmp_path / "src", family, seed=3, **{**changes, "norm_topk_prob": not renormalised})
    cfg = ModelConfig.from_pretrained(write_moe_gguf(tmp_path / "src", tmp_path / "m.gguf", "F32"))
    assert cfg.moe.norm_topk_prob is renormalised


def _tiny_moe_gguf(path, arch: str = "qwen3moe", extra=None, tensors=None):
    """A header-only MoE file (hf_config reads no tensor data) with ``extra`` metadata and ``tensors``."""
    import gguf
    import numpy as np

    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(1)
    w.add_context_length(64)
    w.add_embedding_length(32)
    w.add_feed_forward_length(32)
    w.add_head_count(2)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_vocab_size(16)
    w.add_expert_count(4)
    w.add_expert_used_count(2)
    for key, value in (extra or {}).items():  # as the gguf writer's add_expert_* methods store them
        add = w.add_bool if isinstance(value, bool) else w.add_uint32 if isinstance(value, int) else w.add_float32
        add(f"{arch}.{key}", value)
    w.add_tensor("blk.0.ffn_gate_inp.weight", np.zeros((4, 32), dtype=np.float32))
    for name, shape in (tensors or {}).items():
        w.add_tensor(name, np.zeros(shape, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.mark.parametrize(("extra", "message"), [
    ({"expert_weights_norm": False}, "expert_weights_norm False"),
    ({"expert_gating_func": 2}, "expert_gating_func 2"),
    ({"expert_weights_scale": 2.5}, "expert_weights_scale 2.5"),
    ({"expert_shared_count": 2}, "expert_shared_count 2"),
])
def test_routing_metadata_hyspec_does_not_run_is_refused_by_name(extra, message, tmp_path):
    from hyspec.model.gguf_checkpoint import GGUFCheckpoint

    ckpt = GGUFCheckpoint(_tiny_moe_gguf(tmp_path / "m.gguf", extra=extra))
    with pytest.raises(CheckpointError, match=f"{message}.* is not supported in a qwen3moe mixture-of-experts GGUF"):
        ckpt.hf_config()


@pytest.mark.parametrize("tensor", ["blk.0.ffn_gate_up_exps.weight", "blk.0.ffn_exp_probs_b.bias",
                                    "blk.0.ffn_gate_inp.bias"])
def test_expert_tensors_hyspec_does_not_read_are_refused_by_name(tensor, tmp_path):
    from hyspec.model.gguf_checkpoint import GGUFCheckpoint

    path = _tiny_moe_gguf(tmp_path / "m.gguf", tensors={tensor: (4, 32)})
    with pytest.raises(CheckpointError, match=f"GGUF tensor {tensor} .*is not supported"):
        GGUFCheckpoint(path)


def test_a_stack_with_the_wrong_expert_count_is_named(tmp_path):
    from hyspec.model.gguf_checkpoint import GGUFCheckpoint

    path = _tiny_moe_gguf(tmp_path / "m.gguf", tensors={"blk.0.ffn_up_exps.weight": (3, 32, 32)})
    with pytest.raises(CheckpointError, match=r"ffn_up_exps.weight .*expert_count says 4 experts"):
        GGUFCheckpoint(path)


def test_a_moe_gguf_of_another_architecture_is_refused_by_name(tmp_path):
    from hyspec.model.gguf_checkpoint import GGUFCheckpoint

    with pytest.raises(CheckpointError, match="architecture 'qwen2'.*llama \\(Mixtral\\), qwen2moe and qwen3moe"):
        GGUFCheckpoint(_tiny_moe_gguf(tmp_path / "m.gguf", arch="qwen2"))


@pytest.mark.parametrize("name", ["mixtral", "qwen2_moe"])
def test_export_hf_refuses_a_moe_gguf(name, tmp_path):
    """transformers' GGUF reader turns a Mixtral file into a dense Llama (the experts dropped) and stops on the
    Qwen MoE expert shapes: export-hf writes nothing rather than another model."""
    from hyspec.errors import HyspecError
    from hyspec.model.export_hf import export_hf

    _source(name, tmp_path / "src")
    gguf_file = write_moe_gguf(tmp_path / "src", tmp_path / "m.gguf", "F32")
    with pytest.raises(HyspecError, match=r"mixture-of-experts model \((mixtral|qwen2_moe)\).*nothing was written"):
        export_hf(gguf_file, tmp_path / "out")
    assert not (tmp_path / "out").exists()
