"""The base of drafters that read the target's embedding and lm_head (MTP, DFlash and DSpark).

Such a drafter holds the two ``[V, H]`` tensors by reference in a plain dict
(``shared``), so they are neither parameters nor buffers: the target owns
them, an optimiser training the drafter never sees them, and ``state_dict``
(hence every drafter checkpoint) leaves them out.  Its logits are the op
table's ``logits`` op on the target's lm_head, the same op the target's own
``CausalLM.compute_logits`` runs, so a backend's faster matmul (the CPU
backend's packed weights) serves both without touching either module.

EAGLE heads hold the whole target instead (``target.compute_logits``, the same
op) or an lm_head of their own (EAGLE-3's reduced vocabulary).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from hyspec.ops import OpTable, reference_ops


class TargetHeadDrafter(nn.Module):
    """A drafter module over the target's embedding and lm_head (held, not owned)."""

    def __init__(self, embed_weight: torch.Tensor, lm_head_weight: torch.Tensor, ops: OpTable | None = None):
        super().__init__()
        self.ops = ops or reference_ops()
        # Plain attributes, not parameters: the target owns (and the optimiser never sees) them; not saved.
        self.shared = {"embed": embed_weight, "lm_head": lm_head_weight}

    def shared_weight(self, name: str, like: torch.Tensor) -> torch.Tensor:
        """The target's ``"embed"`` or ``"lm_head"`` in ``like``'s dtype and device (itself when they match)."""
        w = self.shared[name]
        return w if w.dtype == like.dtype and w.device == like.device else w.to(like.device, like.dtype)

    def embed_target(self, input_ids: torch.Tensor, like: torch.Tensor) -> torch.Tensor:  # [...] -> [..., H]
        """The target's embedding of ``input_ids``, in ``like``'s dtype."""
        return F.embedding(input_ids, self.shared_weight("embed", like))

    def head_logits(self, hidden: torch.Tensor) -> torch.Tensor:  # [..., H] -> [..., V] fp32
        """The target's lm_head on ``hidden`` (matmul in the activation dtype): the op table's ``logits``."""
        return self.ops.logits(hidden, self.shared_weight("lm_head", hidden))


__all__ = ["TargetHeadDrafter"]
