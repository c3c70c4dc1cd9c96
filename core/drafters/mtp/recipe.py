"""Training recipe for MTP modules (``hyspec train-draft --method mtp``).

Loss: DeepSeek-V3's MTP objective, ``L = (1/D) sum_m L_m`` where module ``m``
at position ``j`` predicts token ``t[j+m+2]`` (``D`` = number of modules; the
report's extra weight lambda only balances MTP against the main LM loss,
which is not trained here).  ``L_m`` is a cross-entropy against the
*target's* next-token distribution at position ``j+m+1`` (soft labels, i.e.
distillation), not the data's next token: a draft is accepted when it agrees
with the target, whatever the data said.  Teacher forcing: module ``m+1``
consumes module ``m``'s outputs over the true tokens, as in DeepSeek's
sequential MTP.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from hyspec.drafters.checkpoint_io import STORAGE
from hyspec.drafters.mtp.checkpoint import load_mtp, save_deepseek_layout, save_mtp
from hyspec.drafters.mtp.model import MTPConfig, MTPDrafter
from hyspec.errors import ConfigError
from hyspec.model.config import ModelConfig
from hyspec.model.llama import CausalLM
from hyspec.train.base import DrafterRecipe, TargetBatch, register_recipe

LAYOUTS = ("hyspec", "deepseek")


def soft_cross_entropy(logits: torch.Tensor, target_logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """``-sum_v p(v) log q(v)`` per row, q = softmax(logits), p = softmax(target_logits / temperature).

    ``[..., V] -> [...]``.  A teacher temperature below 1 sharpens p towards the
    target's argmax -- what temperature-0 serving accepts -- when the target's
    distribution is flat.
    """
    p = torch.softmax(target_logits.float() / temperature, dim=-1)
    return -(p * torch.log_softmax(logits.float(), dim=-1)).sum(-1)


def teacher_temperature(options: dict[str, Any]) -> float:
    value = float(options.get("teacher_temperature", 1.0))
    if not value > 0:
        raise ConfigError("teacher_temperature", f"must be > 0, got {value}")
    return value


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    mask = mask.to(values.dtype)
    return (values * mask).sum() / mask.sum().clamp_min(1.0)


class MTPRecipe(DrafterRecipe):
    method = "mtp"

    def build(self, target: CausalLM, options: dict[str, Any]) -> nn.Module:
        """Options: ``num_modules`` (alias ``layers``; default 1, deeper drafts reuse the last module),
        ``layout`` (hyspec | deepseek), ``teacher_temperature`` (1.0), ``storage`` (float32 | bfloat16 | int8:
        how the hyspec layout stores the weights)."""
        num_modules = int(options.get("num_modules") or options.get("layers") or 1)
        layout = options.get("layout", "hyspec")
        if num_modules < 1:
            raise ConfigError("num_modules", f"must be >= 1, got {num_modules}")
        if layout not in LAYOUTS:
            raise ConfigError("layout", f"must be one of {', '.join(LAYOUTS)}, got {layout!r}")
        drafter = MTPDrafter(MTPConfig(target.config, num_modules), target.embed_tokens.weight,
                             target.lm_head_weight, ops=target.ops, max_positions=target.max_positions)
        drafter = drafter.to(device=target.embed_tokens.weight.device, dtype=torch.float32)
        with torch.no_grad():
            for layer in drafter.layers:  # start the head norm where the target's final norm is
                layer.head_norm.weight.copy_(target.norm.weight.float())
        drafter.save_layout = layout
        drafter.storage = options.get("storage") or "float32"
        if drafter.storage not in STORAGE:
            raise ConfigError("storage", f"must be one of {', '.join(STORAGE)}, got {drafter.storage!r}")
        drafter.teacher_temperature = teacher_temperature(options)
        return drafter

    def loss(self, drafter: nn.Module, target: CausalLM, batch: TargetBatch) -> tuple[torch.Tensor, dict[str, float]]:
        assert isinstance(drafter, MTPDrafter)
        ids, S = batch.input_ids, batch.input_ids.shape[1]
        target_logits = batch.target_logits(target)  # [B, S, V]: row s = the target's law of token s+1
        x = batch.hidden.float()  # H_0 = the target's hidden after its final norm
        losses, metrics = [], {}
        for m in range(drafter.num_modules):
            entries = S - 1 - m  # module m at j = 0..S-2-m consumes t[j+m+1] and predicts t[j+m+2]
            if entries < 1:
                break
            out = drafter.forward_dense(m, ids[:, m + 1:m + 1 + entries], x[:, :entries])
            logits = drafter.logits(m, out)
            teacher = target_logits[:, m + 1:m + 1 + entries]
            mask = batch.loss_mask[:, m + 1:m + 1 + entries]
            ce = soft_cross_entropy(logits, teacher, getattr(drafter, "teacher_temperature", 1.0))
            losses.append(masked_mean(ce, mask))
            with torch.no_grad():
                agree = (logits.argmax(-1) == teacher.argmax(-1)).float()
                metrics[f"top1_module{m}"] = float(masked_mean(agree, mask))
            x = out
        if not losses:
            raise ValueError(f"sequences of {S} tokens are too short to train MTP (need at least 2)")
        loss = torch.stack(losses).mean()
        metrics["loss"] = float(loss.detach())
        return loss, metrics

    def load_weights(self, drafter: nn.Module, target: CausalLM, folder: Path) -> None:
        assert isinstance(drafter, MTPDrafter)
        saved = load_mtp(folder, target.config, target.embed_tokens.weight, target.lm_head_weight, torch.float32,
                         device="cpu")  # checks the saved modules against the target
        if saved.num_modules != drafter.num_modules:
            raise ConfigError("--init-from", f"the MTP drafter in {folder} has {saved.num_modules} module(s); "
                                             f"this run trains {drafter.num_modules}")
        with torch.no_grad():
            drafter.load_state_dict(saved.state_dict(), strict=False)

    def save(self, drafter: nn.Module, target_dir: Path, out_dir: Path) -> None:
        assert isinstance(drafter, MTPDrafter)
        if getattr(drafter, "save_layout", "hyspec") == "deepseek":
            save_deepseek_layout(drafter, target_dir, out_dir)
        else:
            save_mtp(drafter, out_dir, ModelConfig.raw_dict(target_dir),  # a directory or a GGUF file
                     storage=getattr(drafter, "storage", "float32"))


register_recipe(MTPRecipe())
