"""Reference RMSNorm, bit-for-bit the Hugging Face Llama/Qwen formulation."""
from __future__ import annotations

import torch


def rms_norm(
    x: torch.Tensor,  # [..., H]
    weight: torch.Tensor,  # [H]
    eps: float,
    residual: torch.Tensor | None = None,  # [..., H]
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """``weight * x / rms(x)`` computed in fp32.

    With ``residual``, first ``x = x + residual`` (in the activation dtype, as
    the reference models do) and return ``(normed, x)`` so the caller carries
    the new residual stream.
    """
    if residual is not None:
        x = x + residual
        return _norm(x, weight, eps), x
    return _norm(x, weight, eps)


def _norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    dtype = x.dtype
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(dtype)
