"""The reference ``logits`` op: the lm-head matmul, hidden states to fp32 logits.

``weight`` is the ``[V, H]`` lm_head (the input embedding when tied).  The
matmul runs in the activation dtype and the result is widened to fp32, the
precision every sampler and verifier works in.  Backends may replace it (the
CPU backend's version multiplies against a copy of ``weight`` packed once for
oneDNN / MKL, ``hyspec.cpu_ops.packed_linear.packed_logits``); the conformance
suite holds any replacement to this one.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def compute_logits(hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:  # [..., H], [V, H] -> [..., V] fp32
    return F.linear(hidden, weight).float()
