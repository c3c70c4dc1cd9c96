"""hyspec's ``rms_norm`` on torch_npu: ``npu_rms_norm`` and ``npu_add_rms_norm``.

NOT EXECUTED ON ASCEND HARDWARE (tested on CPU against hyspec.npu_ops.emulation).

Contract kept from the reference: without ``residual`` the normed tensor;
with it ``(normed, x + residual)``.  ``npu_add_rms_norm(x1, x2, gamma, eps)
-> (y, rstd, x1 + x2)`` is exactly that pair.  Calls the kernels do not
document (weight dtype other than x's, 1-D inputs) run the reference, so
the result dtype is always the reference's.
"""
from __future__ import annotations

from typing import Callable

import torch

from hyspec.ops.norm import rms_norm as reference_rms_norm

NORM_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


class NpuRmsNorm:
    """``OpTable.rms_norm`` backed by torch_npu."""

    def __init__(self, rms_norm: Callable | None = None, add_rms_norm: Callable | None = None):
        if rms_norm is None and add_rms_norm is None:
            raise ValueError("NpuRmsNorm needs npu_rms_norm or npu_add_rms_norm")
        self.rms_norm = rms_norm
        self.add_rms_norm = add_rms_norm

    def __call__(
        self,
        x: torch.Tensor,  # [..., H]
        weight: torch.Tensor,  # [H]
        eps: float,
        residual: torch.Tensor | None = None,  # [..., H]
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        documented = (x.dtype in NORM_DTYPES and weight.dtype == x.dtype and x.dim() >= 2
                      and weight.shape == x.shape[-1:])
        if residual is None:
            if not documented or self.rms_norm is None:
                return reference_rms_norm(x, weight, eps)
            return self.rms_norm(x, weight, eps)[0]
        if not documented or residual.shape != x.shape or residual.dtype != x.dtype:
            return reference_rms_norm(x, weight, eps, residual)
        if self.add_rms_norm is not None:
            normed, _rstd, summed = self.add_rms_norm(x, residual, weight, eps)
            return normed, summed
        summed = x + residual
        return self.rms_norm(summed, weight, eps)[0], summed
