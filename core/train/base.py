"""The contract between ``hyspec train-draft`` and each drafting method's recipe.

The trainer (``hyspec.train.trainer``) owns data, batching, the frozen target,
optimisation, progress, resumable checkpoints and atomic output.  A recipe
owns what is specific to one method: which target layers it reads, how its
module is built, its loss (the loss of the method's paper), and how it is
saved (the public checkpoint layout where one exists, so that hyspec's
loader -- and for EAGLE/MTP, other engines -- read it back).
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from hyspec.errors import HyspecError
from hyspec.model.config import ModelConfig
from hyspec.model.llama import CausalLM


@dataclass
class TargetBatch:
    """One training batch with the frozen target's view of it (computed under no_grad)."""

    input_ids: torch.Tensor  # [B, S] int64
    loss_mask: torch.Tensor  # [B, S] bool: positions whose next-token prediction counts
    hidden: torch.Tensor  # [B, S, H] target hidden after the final norm (what lm_head sees)
    aux: dict[int, torch.Tensor] = field(default_factory=dict)  # layer -> [B, S, H] residual stream after it

    def target_logits(self, target: CausalLM) -> torch.Tensor:  # [B, S, V] fp32
        """The target's next-token logits (recomputed from ``hidden``: cheap next to the forward)."""
        with torch.no_grad():
            return target.compute_logits(self.hidden)


class DrafterRecipe(ABC):
    """How one method is trained and saved."""

    method: str
    #: the trainer passes option ``token_counts`` (how often each target token is to be predicted in the
    #: training windows) when the user gave none: a recipe with a reduced draft vocabulary chooses from it
    wants_token_counts: bool = False

    def aux_layers(self, target_cfg: ModelConfig) -> tuple[int, ...]:
        """Target layers whose residual stream the drafter reads (besides the final hidden)."""
        return ()

    @abstractmethod
    def build(self, target: CausalLM, options: dict[str, Any]) -> nn.Module:
        """A freshly initialised drafter for ``target`` (``options`` from the CLI, e.g. layers)."""

    @abstractmethod
    def loss(self, drafter: nn.Module, target: CausalLM, batch: TargetBatch) -> tuple[torch.Tensor, dict[str, float]]:
        """Scalar training loss and logged metrics (e.g. per-position top-1 accuracy)."""

    @abstractmethod
    def save(self, drafter: nn.Module, target_dir: Path, out_dir: Path) -> None:
        """Write ``config.json`` + ``model.safetensors`` (+ tokenizer files if the method needs them) into out_dir."""

    def load_weights(self, drafter: nn.Module, target: CausalLM, folder: Path) -> None:
        """Overwrite ``drafter``'s weights with those of a drafter this recipe saved (``--init-from``).

        The saved drafter must have been trained for ``target`` and have ``drafter``'s shape; otherwise an
        error names both.  Recipes that cannot read their own output back say so here.
        """
        raise HyspecError(f"--init-from is not supported for {self.method} yet: train it from scratch")

    def trainable_parameters(self, drafter: nn.Module) -> list[nn.Parameter]:
        """Parameters to optimise (shared target weights such as lm_head stay frozen)."""
        return [p for p in drafter.parameters() if p.requires_grad]


RECIPES: dict[str, DrafterRecipe] = {}


def register_recipe(recipe: DrafterRecipe) -> DrafterRecipe:
    RECIPES[recipe.method] = recipe
    return recipe
