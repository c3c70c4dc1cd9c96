"""Tiny random mixture-of-experts checkpoints in the published Hugging Face layout (transformers is the oracle).

Two configurations per architecture, differing in expert count, top-k, renormalisation, GQA, tying and which
layers are routed, so that each of hyspec.model.moe_config's readings is exercised."""
from __future__ import annotations

from pathlib import Path

import torch

MOE_FAMILIES = {
    # name: (transformers config class, kwargs)
    "mixtral_a": ("MixtralConfig", dict(num_attention_heads=4, num_key_value_heads=2, num_local_experts=4,
                                        num_experts_per_tok=2, sliding_window=None)),
    "mixtral_b": ("MixtralConfig", dict(num_attention_heads=4, num_key_value_heads=1, num_local_experts=6,
                                        num_experts_per_tok=3, sliding_window=None, tie_word_embeddings=True)),
    # norm_topk_prob off (Qwen1.5-MoE), every layer routed
    "qwen2_moe_a": ("Qwen2MoeConfig", dict(num_attention_heads=4, num_key_value_heads=2, num_experts=4,
                                           num_experts_per_tok=2, moe_intermediate_size=40,
                                           shared_expert_intermediate_size=72, norm_topk_prob=False)),
    # renormalised, three layers: layer 0 dense (mlp_only_layers), 1 routed, 2 dense (decoder_sparse_step 2)
    "qwen2_moe_b": ("Qwen2MoeConfig", dict(num_attention_heads=4, num_key_value_heads=4, num_experts=6,
                                           num_experts_per_tok=3, moe_intermediate_size=24,
                                           shared_expert_intermediate_size=56, norm_topk_prob=True,
                                           decoder_sparse_step=1, mlp_only_layers=[0], layers=3)),
    # Qwen3-30B-A3B's readings: renormalised, q/k norms, no shared expert
    "qwen3_moe_a": ("Qwen3MoeConfig", dict(num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_experts=8,
                                           num_experts_per_tok=2, moe_intermediate_size=32, norm_topk_prob=True)),
    "qwen3_moe_b": ("Qwen3MoeConfig", dict(num_attention_heads=4, num_key_value_heads=1, head_dim=32, num_experts=5,
                                           num_experts_per_tok=1, moe_intermediate_size=48, norm_topk_prob=False,
                                           decoder_sparse_step=2, tie_word_embeddings=True, layers=3)),
}


def make_moe_model(name: str, path: Path, vocab_size: int = 128, hidden_size: int = 64, seed: int = 0,
                   dtype: torch.dtype = torch.float32, **overrides):
    """Create a random HF MoE model of family ``name``, save it (safetensors) to ``path``, return it."""
    import transformers

    cls_name, kwargs = MOE_FAMILIES[name]
    kwargs = {**kwargs, **overrides}
    layers = kwargs.pop("layers", 2)
    base = dict(vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=2 * hidden_size + 8,
                num_hidden_layers=layers, max_position_embeddings=256, rms_norm_eps=1e-5,
                bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=False)
    base.update(kwargs)
    cfg = getattr(transformers, cls_name)(**base)
    torch.manual_seed(seed)
    model = getattr(transformers, cls_name.replace("Config", "ForCausalLM"))(cfg).eval()
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "norm" in n or n.endswith("bias"):
                p.add_(torch.randn_like(p) * 0.1)
            elif n.endswith("gate.weight"):  # routers (and Qwen2-MoE's shared gate): spread the choices
                p.copy_(torch.randn_like(p))
    model = model.to(dtype)
    model.save_pretrained(path, safe_serialization=True)
    return model


def make_moe_checkpoint(path: Path, name: str, seed: int = 0, **kw):
    """A complete MoE checkpoint with the tiny tokenizer (tests.model.tiny_checkpoint's vocabulary)."""
    from tests.model.tiny_checkpoint import VOCAB, write_tokenizer

    path.mkdir(parents=True, exist_ok=True)
    model = make_moe_model(name, path, vocab_size=VOCAB, seed=seed, **kw)
    write_tokenizer(path)
    return model
