"""Fused RMSNorm (optionally with the residual add) matching ``hyspec.ops.norm.rms_norm``.

The reference computes, per row, in this order: ``x = x + residual`` in the
activation dtype; ``h = fp32(x) * rsqrt(mean(fp32(x)^2) + eps)``; ``h`` rounded
to the activation dtype; ``weight * h`` in ``promote(weight, x)``.  The kernel
does every step in fp32 and rounds where torch rounds, so only the order of
the fp32 sum of squares differs from the reference.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from hyspec.cuda_ops.common import (TRITON_DTYPES, KernelInputError, check_device, check_dtype,
                                    interpreted, next_power_of_2, round_to, round_trip)

#: A program holds whole rows in registers; wider rows would spill.
MAX_HIDDEN = 65536
#: Elements per program: rows narrower than this are batched several to a program.
ROW_TILE_ELEMENTS = 2048


@triton.jit(do_not_specialize=["n_rows"])  # per step: one binary for every batch
def _rms_norm_kernel(
    x_ptr, res_ptr, w_ptr, out_ptr, new_res_ptr,
    stride_x, stride_res, stride_out, stride_new_res,
    n_rows, hidden, eps,
    X_DTYPE: tl.constexpr, OUT_DTYPE: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
    BLOCK_ROWS: tl.constexpr, BLOCK_H: tl.constexpr, SOFT_BF16: tl.constexpr,
):
    rows = (tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)).to(tl.int64)[:, None]  # [BLOCK_ROWS, 1]
    cols = tl.arange(0, BLOCK_H)[None, :]
    mask = (rows < n_rows) & (cols < hidden)
    x = tl.load(x_ptr + rows * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        r = tl.load(res_ptr + rows * stride_res + cols, mask=mask, other=0.0).to(tl.float32)
        x = round_trip(x + r, X_DTYPE, SOFT_BF16)  # the add happens in the activation dtype
        tl.store(new_res_ptr + rows * stride_new_res + cols, round_to(x, X_DTYPE, SOFT_BF16), mask=mask)
    mean_sq = tl.sum(x * x, axis=1) / hidden  # [BLOCK_ROWS]
    h = round_trip(x * tl.math.rsqrt(mean_sq + eps)[:, None], X_DTYPE, SOFT_BF16)
    w = tl.load(w_ptr + cols, mask=cols < hidden, other=0.0).to(tl.float32)
    tl.store(out_ptr + rows * stride_out + cols, round_to(w * h, OUT_DTYPE, SOFT_BF16), mask=mask)


def _rows(op: str, name: str, t: torch.Tensor, hidden: int) -> torch.Tensor:
    """``t`` as ``[rows, hidden]`` with unit column stride (a view when possible)."""
    if t.shape[-1] != hidden:
        raise KernelInputError(f"{op}: {name} has last dimension {t.shape[-1]}, expected {hidden}")
    flat = t.reshape(-1, hidden)
    return flat if flat.stride(-1) == 1 else flat.contiguous()


def triton_rms_norm(
    x: torch.Tensor,  # [..., H]
    weight: torch.Tensor,  # [H]
    eps: float,
    residual: torch.Tensor | None = None,  # [..., H]
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Same contract as ``hyspec.ops.norm.rms_norm``: ``normed`` or ``(normed, x + residual)``."""
    op = "rms_norm"
    hidden = x.shape[-1]
    if weight.dim() != 1 or weight.shape[0] != hidden:
        raise KernelInputError(f"{op}: weight has shape {tuple(weight.shape)}, expected ({hidden},)")
    if not 1 <= hidden <= MAX_HIDDEN:
        raise KernelInputError(f"{op}: hidden size {hidden} not in [1, {MAX_HIDDEN}]")
    check_dtype(op, "x", x)
    check_dtype(op, "weight", weight)
    tensors = [x, weight]
    if residual is not None:
        if residual.shape != x.shape or residual.dtype != x.dtype:
            raise KernelInputError(f"{op}: residual {tuple(residual.shape)} {residual.dtype} must match x "
                                   f"{tuple(x.shape)} {x.dtype}")
        tensors.append(residual)
    check_device(op, _rms_norm_kernel, *tensors)

    out_dtype = torch.promote_types(weight.dtype, x.dtype)
    x2 = _rows(op, "x", x, hidden)
    n_rows = x2.shape[0]
    out = torch.empty(x.shape, dtype=out_dtype, device=x.device)
    out2 = out.view(-1, hidden)
    if residual is not None:
        res2 = _rows(op, "residual", residual, hidden)
        new_res = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        new_res2 = new_res.view(-1, hidden)
    else:
        res2, new_res2 = x2, out2  # unused by the kernel (HAS_RESIDUAL=False)
    if n_rows > 0:
        block_h = next_power_of_2(hidden)
        block_rows = max(1, ROW_TILE_ELEMENTS // block_h)  # narrow rows: several per program
        _rms_norm_kernel[(triton.cdiv(n_rows, block_rows),)](
            x2, res2, weight, out2, new_res2,
            x2.stride(0), res2.stride(0), out2.stride(0), new_res2.stride(0),
            n_rows, hidden, float(eps),
            X_DTYPE=TRITON_DTYPES[x.dtype], OUT_DTYPE=TRITON_DTYPES[out_dtype],
            HAS_RESIDUAL=residual is not None, BLOCK_ROWS=block_rows, BLOCK_H=block_h,
            SOFT_BF16=interpreted(_rms_norm_kernel),
            num_warps=min(max(block_h * block_rows // 256, 1), 16), enable_fp_fusion=False,  # as torch rounds
        )
    if residual is not None:
        return out, new_res
    return out
