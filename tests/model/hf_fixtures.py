"""Tiny random Hugging Face checkpoints, written in HF format for the tests (transformers is the oracle)."""
from __future__ import annotations

from pathlib import Path

import torch

FAMILIES = {
    # name: (transformers config class, kwargs)
    "llama_gqa": ("LlamaConfig", dict(num_attention_heads=4, num_key_value_heads=2)),
    "llama_tied": ("LlamaConfig", dict(num_attention_heads=4, num_key_value_heads=4, tie_word_embeddings=True)),
    "llama_bias": ("LlamaConfig", dict(num_attention_heads=4, num_key_value_heads=2, attention_bias=True)),
    "llama3_rope": ("LlamaConfig", dict(num_attention_heads=4, num_key_value_heads=1, rope_scaling={
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64})),
    "llama_linear_rope": ("LlamaConfig", dict(num_attention_heads=4, num_key_value_heads=2,
                                              rope_scaling={"rope_type": "linear", "factor": 2.0})),
    "llama_yarn_rope": ("LlamaConfig", dict(num_attention_heads=4, num_key_value_heads=2, rope_scaling={
        "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64})),
    "mistral": ("MistralConfig", dict(num_attention_heads=4, num_key_value_heads=2, sliding_window=None)),
    # a window the 11-token prompt + 64 decode steps run far past (Mistral-7B-v0.1: 4096 of 32768)
    "mistral_window": ("MistralConfig", dict(num_attention_heads=4, num_key_value_heads=2, sliding_window=8)),
    # Qwen2's windowed layers: layer 0 full, layer 1 sliding (use_sliding_window + max_window_layers)
    "qwen2_window": ("Qwen2Config", dict(num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True,
                                         use_sliding_window=True, sliding_window=8, max_window_layers=1)),
    "qwen2": ("Qwen2Config", dict(num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)),
    "qwen3": ("Qwen3Config", dict(num_attention_heads=4, num_key_value_heads=2, head_dim=16)),
    # Gemma 2: sliding / full layers alternating past an 8-token window, soft-capped scores and logits (caps
    # small enough to bend a tiny random model's values), query_pre_attn_scalar apart from head_dim
    "gemma2": ("Gemma2Config", dict(num_attention_heads=4, num_key_value_heads=2, head_dim=16, sliding_window=8,
                                    query_pre_attn_scalar=24, attn_logit_softcapping=0.5,
                                    final_logit_softcapping=0.3, attn_implementation="eager")),
    "gemma2_mqa": ("Gemma2Config", dict(num_attention_heads=4, num_key_value_heads=1, head_dim=32, sliding_window=6,
                                        query_pre_attn_scalar=32, attn_logit_softcapping=50.0,
                                        final_logit_softcapping=None, tie_word_embeddings=False,
                                        layer_types=["full_attention", "sliding_attention"],
                                        attn_implementation="eager")),
    # Gemma 3: q/k norms, a local RoPE base on the sliding layers, linear scaling on the global ones
    "gemma3": ("Gemma3TextConfig", dict(
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, sliding_window=8, query_pre_attn_scalar=16,
        layer_types=["sliding_attention", "full_attention"],
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                         "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0}},
        attn_implementation="eager")),
    "gemma3_softcap": ("Gemma3TextConfig", dict(
        num_attention_heads=2, num_key_value_heads=2, head_dim=32, sliding_window=5, query_pre_attn_scalar=40,
        # transformers' Gemma 3 does not apply attn_logit_softcapping (a config key it keeps unused): nor does hyspec
        attn_logit_softcapping=1.0, final_logit_softcapping=0.5, tie_word_embeddings=False,
        layer_types=["full_attention", "sliding_attention"],
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
                         "full_attention": {"rope_type": "default", "rope_theta": 50000.0}},
        attn_implementation="eager")),
    # Phi-3: q/k/v and gate/up stored fused; the 4k variants' window on every layer
    "phi3": ("Phi3Config", dict(num_attention_heads=4, num_key_value_heads=2, sliding_window=None)),
    "phi3_window": ("Phi3Config", dict(num_attention_heads=4, num_key_value_heads=1, sliding_window=8,
                                       tie_word_embeddings=True)),
}


#: Phi-3 with longrope (the 128k variants' scheme) at a tiny original context of 32 of 128 positions.  Kept out of
#: FAMILIES: transformers switches factor sets at the original length within one generate() (its cache holds
#: keys rotated with the short set), which hyspec does not follow (hyspec.model.rope), so the every-family
#: comparison of test_numerics_vs_transformers.py does not apply; tests/model/test_phi3_longrope.py compares
#: each regime where both pick the same set
LONGROPE_FAMILIES = {
    "phi3_longrope": ("Phi3Config", dict(
        num_attention_heads=4, num_key_value_heads=2, sliding_window=None, max_position_embeddings=128,
        original_max_position_embeddings=32, rope_parameters={
            "rope_type": "longrope", "short_factor": [1.0, 1.02, 1.05, 1.1, 1.2, 1.4, 1.7, 2.0],
            "long_factor": [1.0, 1.3, 2.0, 3.5, 6.0, 10.0, 16.0, 24.0]})),
    # one KV head, head_dim 32 (16 factors), theta 1e5, tied, 48 of 256 positions (factor 5.33)
    "phi3_longrope_b": ("Phi3Config", dict(
        num_attention_heads=2, num_key_value_heads=1, sliding_window=None, max_position_embeddings=256,
        original_max_position_embeddings=48, tie_word_embeddings=True, rope_parameters={
            "rope_type": "longrope", "rope_theta": 100000.0,
            "short_factor": [1.0 + 0.03 * i for i in range(16)], "long_factor": [1.0 + 1.5 * i for i in range(16)]})),
}


def make_hf_model(name: str, path: Path, vocab_size: int = 128, hidden_size: int = 64, layers: int = 2,
                  seed: int = 0, dtype: torch.dtype = torch.float32, intermediate_size: int | None = None):
    """Create a random HF model of family ``name``, save it (safetensors) to ``path``, return it
    (``intermediate_size`` None: 2 x hidden + 8, a width no 32-wide block divides)."""
    import transformers

    cls_name, kwargs = FAMILIES[name] if name in FAMILIES else LONGROPE_FAMILIES[name]
    kwargs = dict(kwargs)
    rope_scaling = kwargs.pop("rope_scaling", None)
    base = dict(vocab_size=vocab_size, hidden_size=hidden_size,
                intermediate_size=2 * hidden_size + 8 if intermediate_size is None else intermediate_size,
                num_hidden_layers=layers, max_position_embeddings=256, rms_norm_eps=1e-5,
                bos_token_id=1, eos_token_id=2, pad_token_id=0)
    base.setdefault("tie_word_embeddings", False)
    base.update(kwargs)
    cfg = getattr(transformers, cls_name)(**base)
    if rope_scaling is not None:
        params = dict(getattr(cfg, "rope_parameters", None) or {"rope_theta": 10000.0})
        params.update(rope_scaling)
        cfg.rope_parameters = params
        cfg.rope_scaling = params
    torch.manual_seed(seed)
    model_cls = getattr(transformers, cls_name.replace("TextConfig", "Config").replace("Config", "ForCausalLM"))
    model = model_cls(cfg).eval()
    # Random init leaves norms at 1 and biases at 0; perturb them so the test sees them.
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "norm" in n or n.endswith("bias"):
                p.add_(torch.randn_like(p) * 0.1)
    model = model.to(dtype)
    model.save_pretrained(path, safe_serialization=True)
    return model


#: per new architecture, the target its speculative identity runs on: a family above and what changes from it
#: (Gemma 2 at its published caps 50 / 30)
IDENTITY_TARGETS = {
    "gemma2": ("gemma2", {"attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0}),
    "gemma3_text": ("gemma3", {}),
    "phi3": ("phi3_window", {}),
    "phi3_longrope": ("phi3_longrope", {}),  # served at max_model_len 128: the long factor set
}


def make_identity_target(arch: str, path: Path) -> Path:
    """The architecture's identity target: the conformance byte tokenizer and vocabulary (320), weights drawn at
    std 0.08 so that greedy choices are rarely near-ties."""
    from hyspec.conformance.tiny import VOCAB, write_tokenizer

    family, changes = IDENTITY_TARGETS[arch]
    cls_name, kwargs = FAMILIES[family] if family in FAMILIES else LONGROPE_FAMILIES[family]
    name = f"{family}_identity"
    FAMILIES[name] = (cls_name, {**kwargs, **changes, "initializer_range": 0.08})
    try:
        make_hf_model(name, path, vocab_size=VOCAB, seed=7)
    finally:
        del FAMILIES[name]
    write_tokenizer(path)
    return path


def identity_workspace(root: Path, target_dir: Path):
    """hyspec's conformance workspace (hyspec.conformance.methods) on ``target_dir`` with the tiny target's
    byte-id prompts (3 to 40 tokens) rather than a real model's text prompts: the hybrid check's rule switches
    methods at 24 tokens of context, so short prompts must be among them."""
    from hyspec.conformance.methods import Workspace
    from hyspec.conformance.tiny import prompts

    class TinyPromptWorkspace(Workspace):
        def prompts(self, count: int) -> list[list[int]]:
            return prompts(count)

    root.mkdir(parents=True, exist_ok=True)
    return TinyPromptWorkspace(root, model=target_dir)
