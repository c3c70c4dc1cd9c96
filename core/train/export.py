"""hyspec modules -> Hugging Face Llama tensors and config (the inverse of ``hyspec.model.loader``).

hyspec stores q/k/v and gate/up fused; HF checkpoints keep them apart.  Recipes
that save decoder layers (draft_model, EAGLE, MTP) share these helpers so
every saved layer reads back through ``hf_state_dict`` and transformers alike.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch

from hyspec.model.config import ModelConfig
from hyspec.model.gguf_checkpoint import is_gguf
from hyspec.model.llama import CausalLM, DecoderLayer
from hyspec.model.tokenizer import Tokenizer

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja")
DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


def decoder_layer_tensors(layer: DecoderLayer, cfg: ModelConfig, prefix: str) -> dict[str, torch.Tensor]:
    """HF names (``{prefix}self_attn.q_proj.weight``, ...) for one decoder layer's weights."""
    q_size = cfg.num_attention_heads * cfg.head_dim
    kv_size = cfg.num_key_value_heads * cfg.head_dim
    attn, mlp = layer.self_attn, layer.mlp
    out: dict[str, torch.Tensor] = {}
    a, m = prefix + "self_attn.", prefix + "mlp."
    q, k, v = attn.qkv_proj.weight.detach().split([q_size, kv_size, kv_size])
    out.update({a + "q_proj.weight": q, a + "k_proj.weight": k, a + "v_proj.weight": v})
    if attn.qkv_proj.bias is not None:
        qb, kb, vb = attn.qkv_proj.bias.detach().split([q_size, kv_size, kv_size])
        out.update({a + "q_proj.bias": qb, a + "k_proj.bias": kb, a + "v_proj.bias": vb})
    out[a + "o_proj.weight"] = attn.o_proj.weight.detach()
    if attn.o_proj.bias is not None:
        out[a + "o_proj.bias"] = attn.o_proj.bias.detach()
    if attn.q_norm is not None:
        out[a + "q_norm.weight"] = attn.q_norm.weight.detach()
        out[a + "k_norm.weight"] = attn.k_norm.weight.detach()
    gate, up = mlp.gate_up_proj.weight.detach().split(cfg.intermediate_size)
    out.update({m + "gate_proj.weight": gate, m + "up_proj.weight": up,
                m + "down_proj.weight": mlp.down_proj.weight.detach()})
    if mlp.gate_up_proj.bias is not None:
        gb, ub = mlp.gate_up_proj.bias.detach().split(cfg.intermediate_size)
        out.update({m + "gate_proj.bias": gb, m + "up_proj.bias": ub,
                    m + "down_proj.bias": mlp.down_proj.bias.detach()})
    out[prefix + "input_layernorm.weight"] = layer.input_layernorm.weight.detach()
    out[prefix + "post_attention_layernorm.weight"] = layer.post_attention_layernorm.weight.detach()
    return out


def causal_lm_tensors(model: CausalLM, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Every weight of ``model`` under its HF ``LlamaForCausalLM`` name, cast to ``dtype``."""
    cfg = model.config
    out = {"model.embed_tokens.weight": model.embed_tokens.weight.detach(),
           "model.norm.weight": model.norm.weight.detach()}
    if model.lm_head is not None:
        out["lm_head.weight"] = model.lm_head.weight.detach()
    for i, layer in enumerate(model.layers):
        out.update(decoder_layer_tensors(layer, cfg, f"model.layers.{i}."))
    return {k: v.to(dtype).contiguous() for k, v in out.items()}


def llama_config_dict(*, vocab_size: int, hidden_size: int, intermediate_size: int, num_hidden_layers: int,
                      num_attention_heads: int, num_key_value_heads: int, head_dim: int, rms_norm_eps: float,
                      max_position_embeddings: int, tie_word_embeddings: bool, rope: dict[str, Any],
                      special_ids: dict[str, Any], torch_dtype: str) -> dict[str, Any]:
    """A transformers-compatible ``LlamaForCausalLM`` config.json body."""
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
        "vocab_size": vocab_size, "hidden_size": hidden_size, "intermediate_size": intermediate_size,
        "num_hidden_layers": num_hidden_layers, "num_attention_heads": num_attention_heads,
        "num_key_value_heads": num_key_value_heads, "head_dim": head_dim, "rms_norm_eps": rms_norm_eps,
        "max_position_embeddings": max_position_embeddings, "tie_word_embeddings": tie_word_embeddings,
        "attention_bias": False, "mlp_bias": False, "torch_dtype": torch_dtype, **rope, **special_ids,
    }


def rope_keys(target_cfg: ModelConfig, head_dim: int | None = None) -> dict[str, Any]:
    """The target's RoPE settings as written in its config.json (a drafter reading the same positions reuses them).

    longrope's factor lists hold one entry per frequency of the target's head: a drafter with the same head_dim
    gets them with every value resolved (a Phi-3 config's top-level original_max_position_embeddings would
    not survive as a llama config), one with another head_dim gets plain RoPE at the target's base."""
    rope = target_cfg.rope
    if rope.rope_type == "longrope":
        if head_dim not in (None, target_cfg.head_dim):
            return {"rope_theta": rope.theta}
        scaling = {"rope_type": "longrope", "short_factor": list(rope.short_factor),
                   "long_factor": list(rope.long_factor), "factor": rope.factor,
                   "original_max_position_embeddings": rope.original_max_position_embeddings}
        for key in ("attention_factor", "short_mscale", "long_mscale"):
            if getattr(rope, key) is not None:
                scaling[key] = getattr(rope, key)
        return {"rope_theta": rope.theta, "rope_scaling": scaling}
    raw = target_cfg.raw
    keys = {k: raw[k] for k in ("rope_theta", "rope_scaling", "rope_parameters") if raw.get(k) is not None}
    keys.setdefault("rope_theta", target_cfg.rope.theta)
    return keys


def special_token_ids(target_cfg: ModelConfig) -> dict[str, Any]:
    return {k: target_cfg.raw[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id") if k in target_cfg.raw}


def write_config(config: dict[str, Any], out_dir: Path) -> None:
    (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")


def copy_tokenizer(target_dir: Path, out_dir: Path) -> None:
    """Copy the target's tokenizer files (a drafter that emits token ids must share the vocabulary);
    for a GGUF target, write the tokenizer its metadata describes as tokenizer.json."""
    if is_gguf(target_dir):
        Tokenizer(target_dir).save(out_dir)
        return
    for name in TOKENIZER_FILES:
        src = Path(target_dir) / name
        if src.is_file():
            shutil.copyfile(src, out_dir / name)
