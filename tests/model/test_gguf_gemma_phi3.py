"""Gemma 2, Gemma 3 and Phi-3 through GGUF files written as llama.cpp's converter writes them (norms stored as
``1 + w`` for Gemma, Phi-3's fused qkv / gate_up, soft-caps as metadata): the file gives the source checkpoint's
logits, and the source checkpoint is transformers'.  Phi-3's longrope files: test_phi3_longrope.py."""
from __future__ import annotations

import pytest
import torch

from hyspec.model.config import ModelConfig
from hyspec.model.loader import load_model
from tests.model.gguf_fixtures import write_gguf
from tests.model.hf_fixtures import FAMILIES, make_hf_model
from tests.model.tiny_checkpoint import VOCAB, write_tokenizer

IDS = torch.arange(3, 318, 5)[None]  # 64 positions: past every window below
#: GGUF architecture -> (hf_fixtures family, changes, layers): what llama.cpp's GGUF can say about each. Gemma's
#: attention scale is not stored (llama.cpp derives it from the model size: head_dim here), nor the layer pattern
#: (llama.cpp fixes it: Gemma 2 alternates from a sliding layer 0, Gemma 3 has every 6th layer full)
SOURCES = {
    "gemma2": ("gemma2", {"query_pre_attn_scalar": 16}, 2),
    "gemma3": ("gemma3", {"layer_types": None}, 6),
    "phi3": ("phi3_window", {}, 2),
}


def _source(arch: str, path):
    family, changes, layers = SOURCES[arch]
    cls_name, kwargs = FAMILIES[family]
    kwargs = {k: v for k, v in {**kwargs, **changes}.items() if v is not None}
    FAMILIES["gguf_source"] = (cls_name, kwargs)
    try:
        hf = make_hf_model("gguf_source", path, vocab_size=VOCAB, intermediate_size=128, seed=3, layers=layers)
    finally:
        del FAMILIES["gguf_source"]
    write_tokenizer(path)
    return hf


def _logits(model) -> torch.Tensor:
    with torch.no_grad():
        return model.compute_logits(model.forward_dense(IDS).hidden)[0]


@pytest.mark.parametrize("arch", sorted(SOURCES))
@pytest.mark.parametrize("qtype", ["F32", "Q8_0"])
def test_round_trip_gives_the_source_checkpoints_logits(arch, qtype, tmp_path):
    src = tmp_path / "src"
    hf = _source(arch, src)
    gguf_file = write_gguf(src, tmp_path / f"{arch}.gguf", qtype, arch)
    cfg_dir, cfg_gguf = ModelConfig.from_pretrained(src), ModelConfig.from_pretrained(gguf_file)
    for field in ("model_type", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                  "num_attention_heads", "num_key_value_heads", "head_dim", "tie_word_embeddings", "rope",
                  "qk_norm", "layer_windows", "hidden_act", "query_pre_attn_scalar", "local_rope"):
        assert getattr(cfg_gguf, field) == getattr(cfg_dir, field), field
    for field in ("attn_logit_softcapping", "final_logit_softcapping"):  # GGUF stores them as float32
        expected = getattr(cfg_dir, field)
        assert getattr(cfg_gguf, field) == (None if expected is None else pytest.approx(expected, rel=1e-7)), field
    ref = _logits(load_model(src, dtype="float32"))
    got = _logits(load_model(gguf_file, dtype="float32"))
    # the same values but Gemma's norms, stored as 1 + w and read back as w: fp32 rounding of that add
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)
    if qtype == "F32":  # and the source is transformers' model
        with torch.no_grad():
            torch.testing.assert_close(ref, hf(IDS).logits[0].float(), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("arch", ["phi3", "gemma2"])
def test_a_q8_0_file_runs_on_the_backends_int8_kernels(arch, tmp_path):
    """The CPU backend computes with the file's Q8_0 codes (Phi-3's fused qkv / gate_up tensors as stored), and
    the logits stay those of the checkpoint holding the kept values, up to the kernels' arithmetic."""
    from hyspec.backends.registry import get_backend

    src = tmp_path / "src"
    _source(arch, src)
    gguf_file = write_gguf(src, tmp_path / f"{arch}.gguf", "Q8_0", arch)
    model = load_model(gguf_file, dtype="float32", backend=get_backend("cpu"))
    assert model.quantization.linears.get("int8 (Q8_0)") == 4 * 2, model.quantization.summary()
    torch.testing.assert_close(_logits(model), _logits(load_model(src, dtype="float32")), atol=1e-4, rtol=1e-4)
