"""RoPE (NeoX ``rotate_half`` layout) matching ``hyspec.ops.rotary.rotary``.

For ``x = [x1, x2]`` (halves of the head dimension) the reference returns
``[x1*cos - x2*sin, x2*cos + x1*sin]`` where cos/sin come from the fp32 table
cast to the activation dtype, and each product and the sum are separate torch
ops (each rounded to the activation dtype).  The kernel rounds at the same
points, so bf16/fp16 results equal the reference bit for bit.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from hyspec.cuda_ops.common import (TRITON_DTYPES, KernelInputError, check_device, check_dtype,
                                    interpreted, next_power_of_2, round_to, round_trip)


#: Elements of the widest (q) tile per program: short rows are batched several tokens to a program.
TILE_ELEMENTS = 2048


@triton.jit
def _rotate_heads(src_ptr, dst_ptr, stride_src_t, stride_src_h, stride_dst_t, stride_dst_h,
                  tokens, token_ok, num_heads, half, cos, sin,
                  DTYPE: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr,
                  SOFT_BF16: tl.constexpr):
    """Rotate heads ``[BLOCK_T, BLOCK_H, BLOCK_HALF]`` of ``tokens`` (``[BLOCK_T, 1, 1]``)."""
    heads = tl.arange(0, BLOCK_H)[None, :, None]
    cols = tl.arange(0, BLOCK_HALF)[None, None, :]
    mask = token_ok & (heads < num_heads) & (cols < half)
    src = src_ptr + tokens * stride_src_t + heads * stride_src_h + cols
    x1 = tl.load(src, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(src + half, mask=mask, other=0.0).to(tl.float32)
    out1 = round_trip(x1 * cos, DTYPE, SOFT_BF16) + round_trip(-x2 * sin, DTYPE, SOFT_BF16)
    out2 = round_trip(x2 * cos, DTYPE, SOFT_BF16) + round_trip(x1 * sin, DTYPE, SOFT_BF16)
    dst = dst_ptr + tokens * stride_dst_t + heads * stride_dst_h + cols
    tl.store(dst, round_to(out1, DTYPE, SOFT_BF16), mask=mask)
    tl.store(dst + half, round_to(out2, DTYPE, SOFT_BF16), mask=mask)


@triton.jit(do_not_specialize=["num_tokens"])  # per step: one binary for every batch
def _rotary_kernel(
    q_ptr, k_ptr, pos_ptr, cache_ptr, q_out_ptr, k_out_ptr,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_pos, stride_cache,
    stride_qot, stride_qoh, stride_kot, stride_koh,
    num_tokens, num_q_heads, num_k_heads, half,
    DTYPE: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_HQ: tl.constexpr, BLOCK_HK: tl.constexpr,
    BLOCK_HALF: tl.constexpr, SOFT_BF16: tl.constexpr,
):
    tokens = (tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)).to(tl.int64)[:, None, None]  # [BLOCK_T, 1, 1]
    token_ok = tokens < num_tokens
    pos = tl.load(pos_ptr + tokens * stride_pos, mask=token_ok, other=0).to(tl.int64)
    cols = tl.arange(0, BLOCK_HALF)[None, None, :]
    row = cache_ptr + pos * stride_cache + cols
    table_ok = token_ok & (cols < half)
    cos = round_trip(tl.load(row, mask=table_ok, other=0.0), DTYPE, SOFT_BF16)  # [BLOCK_T, 1, BLOCK_HALF]
    sin = round_trip(tl.load(row + half, mask=table_ok, other=0.0), DTYPE, SOFT_BF16)
    _rotate_heads(q_ptr, q_out_ptr, stride_qt, stride_qh, stride_qot, stride_qoh, tokens, token_ok,
                  num_q_heads, half, cos, sin, DTYPE, BLOCK_HQ, BLOCK_HALF, SOFT_BF16)
    _rotate_heads(k_ptr, k_out_ptr, stride_kt, stride_kh, stride_kot, stride_koh, tokens, token_ok,
                  num_k_heads, half, cos, sin, DTYPE, BLOCK_HK, BLOCK_HALF, SOFT_BF16)


def triton_rotary(
    q: torch.Tensor,  # [T, Hq, D]
    k: torch.Tensor,  # [T, Hkv, D]
    positions: torch.Tensor,  # [T] int64
    cos_sin_cache: torch.Tensor,  # [max_positions, D] fp32: cos in [:, :D/2], sin in [:, D/2:]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Same contract as ``hyspec.ops.rotary.rotary``: new rotated ``(q, k)``.

    Positions are not range-checked (that would cost a device sync per layer):
    they must lie in ``[0, max_positions)``, as for the reference.
    """
    op = "rotary"
    if q.dim() != 3 or k.dim() != 3 or q.shape[0] != k.shape[0] or q.shape[2] != k.shape[2]:
        raise KernelInputError(f"{op}: q {tuple(q.shape)} and k {tuple(k.shape)} must be [T, H, D] with "
                               "the same T and D")
    T, Hq, D = q.shape
    if D % 2:
        raise KernelInputError(f"{op}: head_dim {D} must be even")
    if cos_sin_cache.dim() != 2 or cos_sin_cache.shape[1] != D or cos_sin_cache.dtype != torch.float32:
        raise KernelInputError(f"{op}: cos_sin_cache must be fp32 [max_positions, {D}], got "
                               f"{cos_sin_cache.dtype} {tuple(cos_sin_cache.shape)}")
    if positions.dim() != 1 or positions.shape[0] != T or positions.dtype not in (torch.int64, torch.int32):
        raise KernelInputError(f"{op}: positions must be int64 [{T}], got {positions.dtype} "
                               f"{tuple(positions.shape)}")
    check_dtype(op, "q", q)
    if k.dtype != q.dtype:
        raise KernelInputError(f"{op}: k dtype {k.dtype} differs from q dtype {q.dtype}")
    check_device(op, _rotary_kernel, q, k, positions, cos_sin_cache)

    # The kernel needs unit stride along D (halves are addressed as +half) and in the table.
    q_in = q if q.stride(2) == 1 else q.contiguous()
    k_in = k if k.stride(2) == 1 else k.contiguous()
    cache = cos_sin_cache if cos_sin_cache.stride(1) == 1 else cos_sin_cache.contiguous()
    q_out, k_out = torch.empty_like(q, memory_format=torch.contiguous_format), torch.empty_like(
        k, memory_format=torch.contiguous_format)
    if T > 0:
        half = D // 2
        block_hq, block_hk, block_half = next_power_of_2(Hq), next_power_of_2(k.shape[1]), next_power_of_2(half)
        block_t = max(1, TILE_ELEMENTS // (block_hq * block_half))
        _rotary_kernel[(triton.cdiv(T, block_t),)](
            q_in, k_in, positions, cache, q_out, k_out,
            q_in.stride(0), q_in.stride(1), k_in.stride(0), k_in.stride(1), positions.stride(0), cache.stride(0),
            q_out.stride(0), q_out.stride(1), k_out.stride(0), k_out.stride(1),
            T, Hq, k.shape[1], half,
            DTYPE=TRITON_DTYPES[q.dtype], BLOCK_T=block_t, BLOCK_HQ=block_hq, BLOCK_HK=block_hk,
            BLOCK_HALF=block_half, SOFT_BF16=interpreted(_rotary_kernel), num_warps=4,
            enable_fp_fusion=False,  # x*cos + rot*sin rounded per op, as the reference
        )
    return q_out, k_out
