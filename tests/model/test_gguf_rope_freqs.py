"""Llama-3.x GGUFs: llama3 RoPE scaling arrives as llama.cpp's ``rope_freqs.weight`` tensor and is applied.

Before this (main at 7185667) the tensor was dropped and the model ran unscaled RoPE: this test fails there.
"""
from __future__ import annotations

import pytest
import torch

from hyspec.model.loader import load_model
from tests.model.gguf_fixtures import make_source_checkpoint, write_gguf
from tests.model.paged_decode import greedy_paged

pytest.importorskip("gguf")

LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 64}


def test_llama3_gguf_matches_transformers_llama3_rope(tmp_path):
    import transformers

    make_source_checkpoint(tmp_path / "src", "llama", rope_scaling=LLAMA3)
    gguf_file = write_gguf(tmp_path / "src", tmp_path / "llama3.gguf", "F32", "llama")
    hf = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "src", dtype=torch.float32).eval()
    assert hf.config.rope_parameters["rope_type"] == "llama3"
    model = load_model(gguf_file, dtype="float32")
    prompt = list(range(3, 43, 3))
    tokens, logits = greedy_paged(model, prompt, steps=90, block_size=16)  # past original_max_position_embeddings
    with torch.no_grad():
        ref = hf(torch.tensor([prompt + tokens[:-1]])).logits[0, len(prompt) - 1:].float()
    torch.testing.assert_close(logits, ref, atol=1e-4, rtol=1e-4)
    assert model.config.rope.freq_factors is not None


def test_the_factors_divide_exactly_what_the_hf_config_scales(tmp_path):
    """The GGUF's factors reproduce the directory's llama3 inverse frequencies (hyspec's own llama3 rule,
    itself checked against transformers in test_numerics_vs_transformers)."""
    make_source_checkpoint(tmp_path / "src", "llama", rope_scaling=LLAMA3)
    gguf_file = write_gguf(tmp_path / "src", tmp_path / "llama3.gguf", "F32", "llama")
    from_dir = load_model(tmp_path / "src", dtype="float32")
    from_gguf = load_model(gguf_file, dtype="float32")
    assert from_dir.config.rope.rope_type == "llama3" and from_gguf.config.rope.rope_type == "default"
    # fp32: the two orders of division round differently; at position ~250 an angle's last bit is ~2e-5 rad
    torch.testing.assert_close(from_gguf.cos_sin, from_dir.cos_sin, atol=1e-5, rtol=0)


def test_export_hf_refuses_a_gguf_whose_rope_scaling_transformers_would_drop(tmp_path):
    from hyspec.errors import HyspecError
    from hyspec.model.export_hf import export_hf

    make_source_checkpoint(tmp_path / "src", "llama", rope_scaling=LLAMA3)
    gguf_file = write_gguf(tmp_path / "src", tmp_path / "llama3.gguf", "F32", "llama")
    with pytest.raises(HyspecError, match="rope_freqs"):
        export_hf(gguf_file, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_windowed_gguf_keeps_its_sliding_window(tmp_path):
    """``llama.attention.sliding_window`` in the file (a Mistral converted to the llama architecture): the
    window is applied as transformers' Mistral applies it, past the window."""
    import transformers

    from tests.model.hf_fixtures import make_hf_model

    hf = make_hf_model("mistral_window", tmp_path / "src", intermediate_size=128)
    gguf_file = write_gguf(tmp_path / "src", tmp_path / "mistral.gguf", "F32", "llama", tokenizer=False)
    model = load_model(gguf_file, dtype="float32")
    assert model.config.model_type == "mistral" and set(model.config.layer_windows) == {8}
    prompt = list(range(3, 30, 3))
    tokens, logits = greedy_paged(model, prompt, steps=20, block_size=16)
    with torch.no_grad():
        ref = hf(torch.tensor([prompt + tokens[:-1]])).logits[0, len(prompt) - 1:].float()
    assert isinstance(hf, transformers.MistralForCausalLM)
    torch.testing.assert_close(logits, ref, atol=1e-4, rtol=1e-4)


def test_export_hf_refuses_a_windowed_gguf(tmp_path):
    from hyspec.errors import HyspecError
    from hyspec.model.export_hf import export_hf
    from tests.model.hf_fixtures import make_hf_model

    make_hf_model("mistral_window", tmp_path / "src", intermediate_size=128)
    gguf_file = write_gguf(tmp_path / "src", tmp_path / "mistral.gguf", "F32", "llama", tokenizer=False)
    with pytest.raises(HyspecError, match="sliding attention window"):
        export_hf(gguf_file, tmp_path / "out")
    assert not (tmp_path / "out").exists()
