"""Training recipe for DSpark (``hyspec train-draft --method dspark``).

Three terms over the same random blocks as DFlash (see dflash_recipe.py),
each decay-weighted over the slots with ``w_j = exp(-(j-1)/gamma)``:

* backbone: DFlash's block cross-entropy of the base logits against the
  target's next-token distribution;
* Markov head: the same cross-entropy of the biased logits
  ``base_j + markov_out(markov_in[t[a+j-1]])``, teacher-forced with the true
  previous token;
* confidence head: binary cross-entropy of ``c_j`` against whether slot j is
  accepted given an accepted prefix.  ``confidence_target = "greedy"``
  (default) uses the temperature-0 event ``argmax q_j == argmax p_j``;
  ``"sampled"`` uses its probability under rejection sampling at temperature
  1, ``1 - TV(p_j, q_j)`` (DeepSpec's soft accept rate).  The head reads the
  backbone's hidden state detached, so it calibrates without bending the drafts.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from hyspec.drafters.dflash.checkpoint import save_drafter
from hyspec.drafters.dflash.recipe import DFlashRecipe, block_config, slot_accuracy
from hyspec.drafters.dspark.model import DEFAULT_CUT_THRESHOLD, DEFAULT_RANK, DSparkDrafter
from hyspec.errors import ConfigError
from hyspec.model.config import ModelConfig
from hyspec.model.llama import CausalLM
from hyspec.train.base import TargetBatch, register_recipe

CONFIDENCE_TARGETS = ("greedy", "sampled")


class DSparkRecipe(DFlashRecipe):
    method = "dspark"

    def build(self, target: CausalLM, options: dict[str, Any]) -> nn.Module:
        """DFlash's options plus ``markov_rank`` (32), ``cut_threshold`` (0.1), ``confidence_target`` (greedy)."""
        mode = options.get("confidence_target", "greedy")
        if mode not in CONFIDENCE_TARGETS:
            raise ConfigError("confidence_target", f"must be one of {', '.join(CONFIDENCE_TARGETS)}, got {mode!r}")
        rank = int(options.get("markov_rank", DEFAULT_RANK))
        if rank < 1:
            raise ConfigError("markov_rank", f"must be >= 1, got {rank}")
        drafter = DSparkDrafter(block_config(target.config, options), target.embed_tokens.weight,
                                target.lm_head_weight, ops=target.ops, max_positions=target.max_positions + 64,
                                markov_rank=rank,
                                cut_threshold=float(options.get("cut_threshold", DEFAULT_CUT_THRESHOLD)))
        drafter = self._prepared(drafter, target, options)
        drafter.confidence_target = mode
        return drafter

    def loss(self, drafter: nn.Module, target: CausalLM, batch: TargetBatch) -> tuple[torch.Tensor, dict[str, float]]:
        assert isinstance(drafter, DSparkDrafter)
        hidden, teacher = self.blocks(drafter, target, batch)
        slots = hidden[:, :, 1:]  # [B, N, K, H]
        base = drafter.logits(slots)
        final = drafter.decoder.biased_logits(base, teacher.previous)
        backbone = self.weighted(drafter, self.cross_entropy(drafter, base, teacher), teacher.mask)
        markov = self.weighted(drafter, self.cross_entropy(drafter, final, teacher), teacher.mask)
        with torch.no_grad():
            if getattr(drafter, "confidence_target", "greedy") == "greedy":
                accepted = (final.argmax(-1) == teacher.logits.argmax(-1)).float()
            else:
                tv = 0.5 * (final.float().softmax(-1) - teacher.logits.float().softmax(-1)).abs().sum(-1)
                accepted = (1.0 - tv).clamp(0.0, 1.0)
        conf_logit = drafter.decoder.confidence_logit(slots.detach(), teacher.previous)
        confidence = self.weighted(drafter, F.binary_cross_entropy_with_logits(conf_logit, accepted, reduction="none"),
                                   teacher.mask)
        loss = backbone + markov + confidence
        metrics = {"loss": float(loss.detach()), "backbone": float(backbone.detach()),
                   "markov": float(markov.detach()), "confidence": float(confidence.detach()),
                   **slot_accuracy(final, teacher)}
        return loss, metrics

    def save(self, drafter: nn.Module, target_dir: Path, out_dir: Path) -> None:
        assert isinstance(drafter, DSparkDrafter)
        save_drafter(drafter, self.method, drafter.config, ModelConfig.from_pretrained(target_dir), out_dir,
                     extra=drafter.extra_config(), storage=getattr(drafter, "storage", None))


register_recipe(DSparkRecipe())
