"""``draft_model``: distil a small Llama from the target's next-token distributions.

The drafter is an ordinary causal LM with the target's tokenizer, trained on
KL(p_target || q_draft) at every counted position (soft targets carry far
more signal per token than the data's hard next token, and they are what the
drafter is judged against at verification).  It is saved as a plain Hugging
Face ``LlamaForCausalLM`` directory, which hyspec's ``load_model`` (the
draft_model proposer) and transformers both read.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from hyspec.errors import ConfigError
from hyspec.model.config import ModelConfig
from hyspec.model.llama import CausalLM
from hyspec.model.weights import write_safetensors_atomically
from hyspec.train.base import DrafterRecipe, TargetBatch, register_recipe
from hyspec.train.export import (DTYPE_NAMES, causal_lm_tensors, copy_tokenizer, llama_config_dict, rope_keys,
                                 special_token_ids, write_config)

# option -> default (None: derived from the others, see draft_config)
OPTIONS: dict[str, Any] = {"layers": 2, "hidden_size": 256, "intermediate_size": None, "heads": None,
                           "kv_heads": None, "tie_word_embeddings": True, "init_std": 0.02,
                           "embedding_init": "random", "storage": None}
EMBEDDING_INITS = ("random", "target_pca")
STORAGES = ("float32", "bfloat16")


def _positive_int(options: dict[str, Any], key: str) -> int:
    value = options[key]
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"draft_model.{key}", f"must be a positive integer, got {value!r}")
    return value


def draft_config(target_cfg: ModelConfig, options: dict[str, Any]) -> dict[str, Any]:
    """The drafter's HF config.json body: defaults filled in, everything checked."""
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise ConfigError(f"draft_model.{unknown[0]}", f"unknown option; draft_model options: {', '.join(OPTIONS)}")
    opts = {**OPTIONS, **{k: v for k, v in options.items() if v is not None}}
    hidden = _positive_int(opts, "hidden_size")
    layers = _positive_int(opts, "layers")
    opts["heads"] = opts["heads"] or max(1, hidden // 64)
    heads = _positive_int(opts, "heads")
    if hidden % heads:
        raise ConfigError("draft_model.heads", f"hidden_size {hidden} is not a multiple of heads {heads}")
    opts["kv_heads"] = opts["kv_heads"] or max(1, heads // 2)
    kv_heads = _positive_int(opts, "kv_heads")
    if heads % kv_heads:
        raise ConfigError("draft_model.kv_heads", f"heads {heads} is not a multiple of kv_heads {kv_heads}")
    if opts["embedding_init"] not in EMBEDDING_INITS:
        raise ConfigError("draft_model.embedding_init", f"must be one of {', '.join(EMBEDDING_INITS)}, "
                                                        f"got {opts['embedding_init']!r}")
    if opts["storage"] is not None and opts["storage"] not in STORAGES:
        raise ConfigError("draft_model.storage", f"must be one of {', '.join(STORAGES)}, got {opts['storage']!r}")
    # SwiGLU's usual 8/3 expansion, rounded up to a multiple of 32 for friendly GEMM shapes.
    opts["intermediate_size"] = opts["intermediate_size"] or 32 * math.ceil(hidden * 8 / 3 / 32)
    intermediate = _positive_int(opts, "intermediate_size")
    return llama_config_dict(
        vocab_size=target_cfg.vocab_size, hidden_size=hidden, intermediate_size=intermediate,
        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=hidden // heads,
        rms_norm_eps=target_cfg.rms_norm_eps, max_position_embeddings=target_cfg.max_position_embeddings,
        tie_word_embeddings=bool(opts["tie_word_embeddings"]), rope=rope_keys(target_cfg, hidden // heads),
        special_ids=special_token_ids(target_cfg), torch_dtype=opts["storage"] or target_cfg.torch_dtype or "float32")


def _init_weights(model: CausalLM, std: float) -> None:
    """GPT-2 style: N(0, std) everywhere, residual output projections scaled down by depth."""
    depth_scale = 1.0 / math.sqrt(2 * len(model.layers))
    with torch.no_grad():
        for name, module in model.named_modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                scale = depth_scale if name.endswith(("o_proj", "down_proj")) else 1.0
                module.weight.normal_(0.0, std * scale)
                if getattr(module, "bias", None) is not None:
                    module.bias.zero_()


def _project_target_embeddings(model: CausalLM, target: CausalLM) -> None:
    """Start the drafter's embedding (tied to its lm_head) at the target's, projected onto its top principal
    directions: the drafter then begins where the target's own output space is widest instead of at noise."""
    h = model.embed_tokens.weight.shape[1]
    with torch.no_grad():
        e = target.embed_tokens.weight.float()  # [V, H_target]
        if h > e.shape[1]:
            raise ConfigError("draft_model.embedding_init", f"target_pca needs hidden_size <= the target's "
                                                            f"{e.shape[1]}, got {h}")
        _, _, vt = torch.linalg.svd(e - e.mean(0), full_matrices=False)  # rows: principal directions
        projected = e @ vt[:h].T  # [V, h], at the target's scale, so that the tied head's logits start there too
        model.embed_tokens.weight.copy_(projected.to(model.embed_tokens.weight.dtype))


class DraftModelRecipe(DrafterRecipe):
    method = "draft_model"

    def build(self, target: CausalLM, options: dict[str, Any]) -> nn.Module:
        config = draft_config(target.config, options)
        model = CausalLM(ModelConfig.from_dict(config), max_positions=target.max_positions)
        _init_weights(model, float(options.get("init_std") or OPTIONS["init_std"]))
        if (options.get("embedding_init") or "random") == "target_pca":
            _project_target_embeddings(model, target)
        model.hf_config = config  # written verbatim by save()
        return model.train()

    def loss(self, drafter: nn.Module, target: CausalLM, batch: TargetBatch) -> tuple[torch.Tensor, dict[str, float]]:
        mask = batch.loss_mask  # [B, S]
        hidden = drafter.forward_dense(batch.input_ids).hidden[mask]  # [N, H_draft]
        logits_q = drafter.compute_logits(hidden)  # [N, V] fp32
        with torch.no_grad():
            logits_p = target.compute_logits(batch.hidden[mask])  # [N, V] fp32
            log_p = F.log_softmax(logits_p, dim=-1)
            p = log_p.exp()
            entropy = -(p * log_p).sum(-1).mean()
        # KL(p || q) = soft cross-entropy H(p, q) minus the target's entropy H(p), a constant for the
        # gradient: the fused soft-label cross_entropy does the V-wide work once.
        kl = F.cross_entropy(logits_q, p) - entropy
        with torch.no_grad():
            acc = (logits_q.argmax(-1) == logits_p.argmax(-1)).float().mean().item()
        return kl, {"acc": acc}

    def save(self, drafter: nn.Module, target_dir: Path, out_dir: Path) -> None:
        config = dict(drafter.hf_config)
        dtype = {v: k for k, v in DTYPE_NAMES.items()}.get(config["torch_dtype"], torch.float32)
        write_config(config, out_dir)
        write_safetensors_atomically(causal_lm_tensors(drafter, dtype), out_dir / "model.safetensors",
                                     metadata={"format": "pt"})
        copy_tokenizer(target_dir, out_dir)


register_recipe(DraftModelRecipe())
