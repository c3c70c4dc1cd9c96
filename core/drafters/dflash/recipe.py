"""Training recipe for DFlash (``hyspec train-draft --method dflash``).

Blocks are anchored at random positions ``a`` of each training window: root
``t[a]``, K mask slots, context = the target features of positions ``< a``.
Slot ``j`` learns the target's own next-token distribution at position
``a+j-1`` (soft labels: the law of ``t[a+j]`` given the true prefix).

Loss: the DFlash paper's decay-weighted block cross-entropy (Chen, Liang, Liu,
arXiv 2602.06036; the form in SpecForge's ``OnlineDFlashModel`` with
``loss_decay_gamma``): slot ``j`` (1-based) is weighted

    w_j = exp(-(j - 1) / gamma)

and the loss is ``sum w_j * mask * CE / sum w_j * mask``.  Later slots only
count if every earlier one was accepted, so they matter less; gamma = 4 for
blocks of about 8 (the paper pairs larger gammas with longer blocks).
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch
from torch import nn

from hyspec.drafters.checkpoint_io import STORAGE
from hyspec.drafters.dflash.checkpoint import save_drafter
from hyspec.drafters.dflash.model import DFlashConfig, DFlashDrafter, default_target_layers
from hyspec.drafters.mtp.recipe import soft_cross_entropy, teacher_temperature
from hyspec.errors import ConfigError
from hyspec.model.config import ModelConfig
from hyspec.model.llama import CausalLM
from hyspec.train.base import DrafterRecipe, TargetBatch, register_recipe

DEFAULTS = {"layers": 2, "block_size": 8, "gamma": 4.0, "anchors": 64}


def block_config(target: ModelConfig, options: dict[str, Any]) -> DFlashConfig:
    """Draft layers of the target's architecture; options ``layers``, ``intermediate_size``, ``block_size``."""
    layers = int(options.get("layers") or DEFAULTS["layers"])
    block = int(options.get("block_size", DEFAULTS["block_size"]))
    if layers < 1:
        raise ConfigError("layers", f"must be >= 1, got {layers}")
    if not 1 <= block <= 64:
        raise ConfigError("block_size", f"must be in 1..64, got {block}")
    # the draft layers attend to all they are given (a target's per-layer sliding windows do not carry over)
    cfg = dataclasses.replace(target, num_hidden_layers=layers, layer_windows=(),
                              intermediate_size=int(options.get("intermediate_size") or target.intermediate_size))
    return DFlashConfig(layers=cfg, target_layers=default_target_layers(target.num_hidden_layers), block_size=block)


def decay_weights(block_size: int, gamma: float, device) -> torch.Tensor:  # [K]
    """``w_j = exp(-(j-1)/gamma)`` for slots j = 1..K (gamma <= 0: uniform)."""
    j = torch.arange(block_size, device=device, dtype=torch.float32)
    return torch.exp(-j / gamma) if gamma > 0 else torch.ones_like(j)


def sample_anchors(loss_mask: torch.Tensor, count: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Up to ``count`` distinct anchors per row among positions ``0..S-2`` whose prediction counts.

    Returns ``(anchors [B, N], valid [B, N])``; rows with fewer candidates pad with invalid anchors.
    """
    B, S = loss_mask.shape
    candidates = loss_mask[:, : S - 1]
    n = max(1, min(count, S - 1))
    score = torch.rand(B, S - 1, device=loss_mask.device).masked_fill(~candidates, 2.0)
    anchors = score.argsort(dim=1)[:, :n].sort(dim=1).values  # random candidates first, then in order
    return anchors, candidates.gather(1, anchors)


class BlockTargets:
    """The teacher side of a batch of blocks: target logits per slot and which slots count."""

    def __init__(self, target_logits: torch.Tensor, input_ids: torch.Tensor, loss_mask: torch.Tensor,
                 anchors: torch.Tensor, valid: torch.Tensor, block_size: int):
        B, S, V = target_logits.shape
        pos = anchors[..., None] + torch.arange(block_size, device=anchors.device)  # [B, N, K]: slot j -> a + j - 1
        inside = pos < S
        pos = pos.clamp(max=S - 1)
        flat = pos.reshape(B, -1)
        self.logits = target_logits.gather(1, flat[..., None].expand(-1, -1, V)).view(*pos.shape, V)
        self.mask = inside & valid[..., None] & loss_mask.gather(1, flat).view(pos.shape)
        # The token each slot follows (teacher forcing for DSpark's Markov head): t[a + j - 1].
        self.previous = input_ids.gather(1, flat).view(pos.shape)


class DFlashRecipe(DrafterRecipe):
    method = "dflash"

    def aux_layers(self, target_cfg: ModelConfig) -> tuple[int, ...]:
        return default_target_layers(target_cfg.num_hidden_layers)

    def build(self, target: CausalLM, options: dict[str, Any]) -> nn.Module:
        """Options: ``layers`` (2), ``block_size`` (8), ``intermediate_size``, ``gamma`` (4), ``anchors`` (64),
        ``teacher_temperature`` (1.0), ``storage`` (None: as trained | float32 | bfloat16 | int8)."""
        drafter = DFlashDrafter(block_config(target.config, options), target.embed_tokens.weight,
                                target.lm_head_weight, ops=target.ops, max_positions=target.max_positions + 64)
        return self._prepared(drafter, target, options)

    @staticmethod
    def _prepared(drafter: nn.Module, target: CausalLM, options: dict[str, Any]) -> nn.Module:
        drafter = drafter.to(device=target.embed_tokens.weight.device, dtype=torch.float32)
        drafter.train_options = {k: float(options.get(k, DEFAULTS[k])) for k in ("gamma", "anchors")}
        drafter.train_options["teacher_temperature"] = teacher_temperature(options)
        drafter.storage = options.get("storage")
        if drafter.storage is not None and drafter.storage not in STORAGE:
            raise ConfigError("storage", f"must be one of {', '.join(STORAGE)}, got {drafter.storage!r}")
        return drafter

    def blocks(self, drafter: DFlashDrafter, target: CausalLM, batch: TargetBatch):
        """Run the backbone over random blocks: ``(hidden [B, N, K+1, H], BlockTargets)``."""
        opts = getattr(drafter, "train_options", DEFAULTS)
        layers = drafter.config.target_layers
        missing = [layer for layer in layers if layer not in batch.aux]
        if missing:
            raise ValueError(f"the batch lacks the target features of layers {missing} the drafter reads")
        context = drafter.context(torch.cat([batch.aux[layer] for layer in layers], dim=-1))
        anchors, valid = sample_anchors(batch.loss_mask, int(opts["anchors"]))
        roots = batch.input_ids.gather(1, anchors)
        hidden = drafter.forward_train(context, roots, anchors)
        teacher = BlockTargets(batch.target_logits(target), batch.input_ids, batch.loss_mask, anchors, valid,
                               drafter.block_size)
        return hidden, teacher

    def weighted(self, drafter: DFlashDrafter, per_slot: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Decay-weighted mean of ``per_slot [B, N, K]`` over the slots that count."""
        gamma = float(getattr(drafter, "train_options", DEFAULTS)["gamma"])
        w = decay_weights(drafter.block_size, gamma, per_slot.device) * mask
        return (per_slot * w).sum() / w.sum().clamp_min(1e-6)

    @staticmethod
    def cross_entropy(drafter: DFlashDrafter, logits: torch.Tensor, teacher: "BlockTargets") -> torch.Tensor:
        temperature = getattr(drafter, "train_options", {}).get("teacher_temperature", 1.0)
        return soft_cross_entropy(logits, teacher.logits, temperature)

    def loss(self, drafter: nn.Module, target: CausalLM, batch: TargetBatch) -> tuple[torch.Tensor, dict[str, float]]:
        assert isinstance(drafter, DFlashDrafter)
        hidden, teacher = self.blocks(drafter, target, batch)
        logits = drafter.logits(hidden[:, :, 1:])  # [B, N, K, V]
        loss = self.weighted(drafter, self.cross_entropy(drafter, logits, teacher), teacher.mask)
        return loss, {"loss": float(loss.detach()), **slot_accuracy(logits, teacher)}

    def save(self, drafter: nn.Module, target_dir: Path, out_dir: Path) -> None:
        assert isinstance(drafter, DFlashDrafter)
        save_drafter(drafter, self.method, drafter.config, ModelConfig.from_pretrained(target_dir), out_dir,
                     storage=getattr(drafter, "storage", None))


def slot_accuracy(logits: torch.Tensor, teacher: BlockTargets) -> dict[str, float]:
    """Top-1 agreement with the target per slot, and the mean accepted prefix of a greedy block."""
    with torch.no_grad():
        agree = (logits.argmax(-1) == teacher.logits.argmax(-1)) & teacher.mask  # [B, N, K]
        counted = teacher.mask.sum((0, 1)).clamp_min(1)
        out = {f"acc{j + 1}": float(a) for j, a in enumerate(agree.sum((0, 1)) / counted)}
        full = teacher.mask.all(-1)
        if bool(full.any()):
            out["accepted_len"] = float(agree[full].int().cumprod(-1).sum(-1).float().mean())
        return out


register_recipe(DFlashRecipe())
