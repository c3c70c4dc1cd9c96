"""What the CPU backend does to a loaded model before serving it."""
from __future__ import annotations

import logging

import torch
from torch import nn

from hyspec.cpu_ops.packed_linear import PackedLinear, PackedLogits, pack_linears, packing_available

log = logging.getLogger(__name__)


def optimize_for_cpu(model: nn.Module) -> nn.Module:
    """Pack linear weights (see packed_linear.py); models keep their interface.

    A model exposing ``lm_head_weight`` and ``compute_logits`` (hyspec's
    CausalLM) also gets its logits matmul packed, tied embeddings included.
    """
    if getattr(model, "_hyspec_cpu_optimized", False):
        return model
    packed = pack_linears(model)
    weight = getattr(model, "lm_head_weight", None)
    if isinstance(weight, torch.Tensor) and hasattr(model, "compute_logits") and packing_available(weight.dtype):
        model.logits_head = PackedLogits(weight)
        model.compute_logits = model.logits_head.forward
        packed += 1
    # Drafters that share the target's lm_head (MTP, DFlash, DSpark) keep it in a ``shared`` dict, not
    # in a Linear: give them a packed copy, kept out of the module tree (it is not a new parameter).
    shared = getattr(model, "shared", None)
    head = shared.get("lm_head") if isinstance(shared, dict) else None
    if isinstance(head, torch.Tensor) and head.device.type == "cpu" and packing_available(head.dtype):
        model.__dict__["packed_lm_head"] = PackedLinear(head, None)
        packed += 1
    model._hyspec_cpu_optimized = True
    log.debug("packed %d linear layers of %s for the CPU", packed, type(model).__name__)
    return model
