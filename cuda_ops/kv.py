"""KV-cache writes and compaction matching ``hyspec.ops.kv``.

Slots address the paged cache as ``slot = block * block_size + offset``; the
caches may be strided views into the shared block-major pool, so every
address is built from the view's four strides in int64 (a pool easily passes
2**31 elements).  Negative slots are skipped (padding tokens), where the
reference's Python indexing would wrap around; callers never pass them.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from hyspec.cuda_ops.common import (TRITON_DTYPES, KernelInputError, check_device, check_dtype,
                                    interpreted, next_power_of_2, round_to)


#: Elements per program: small token rows are batched several tokens to a program.
TILE_ELEMENTS = 4096


@triton.jit(do_not_specialize=["num_tokens"])  # per step: one binary for every batch
def _scatter_kernel(
    k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, slot_ptr,
    stride_kt, stride_kh, stride_kd, stride_vt, stride_vh, stride_vd,
    stride_kcb, stride_kco, stride_kch, stride_kcd, stride_vcb, stride_vco, stride_vch, stride_vcd,
    num_tokens, block_size, num_heads, head_dim,
    CACHE_DTYPE: tl.constexpr, CAST_K: tl.constexpr, CAST_V: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, SOFT_BF16: tl.constexpr,
):
    """Rows of dense ``k``/``v`` ``[T, H, D]`` -> cache slots ``slot_mapping``."""
    t = (tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)).to(tl.int64)[:, None, None]  # [BLOCK_T, 1, 1]
    slot = tl.load(slot_ptr + t, mask=t < num_tokens, other=-1).to(tl.int64)
    heads = tl.arange(0, BLOCK_H)[None, :, None].to(tl.int64)
    dims = tl.arange(0, BLOCK_D)[None, None, :].to(tl.int64)
    mask = (slot >= 0) & (heads < num_heads) & (dims < head_dim)
    page, offset = slot // block_size, slot % block_size
    k = tl.load(k_ptr + t * stride_kt + heads * stride_kh + dims * stride_kd, mask=mask)
    v = tl.load(v_ptr + t * stride_vt + heads * stride_vh + dims * stride_vd, mask=mask)
    if CAST_K:  # a dtype change rounds like torch's .to(); a plain copy stays bitwise
        k = round_to(k.to(tl.float32), CACHE_DTYPE, SOFT_BF16)
    if CAST_V:
        v = round_to(v.to(tl.float32), CACHE_DTYPE, SOFT_BF16)
    tl.store(k_cache_ptr + page * stride_kcb + offset * stride_kco + heads * stride_kch + dims * stride_kcd, k,
             mask=mask)
    tl.store(v_cache_ptr + page * stride_vcb + offset * stride_vco + heads * stride_vch + dims * stride_vcd, v,
             mask=mask)


@triton.jit(do_not_specialize=["num_slots"])
def _gather_kernel(
    k_cache_ptr, v_cache_ptr, k_out_ptr, v_out_ptr, slot_ptr,
    stride_kcb, stride_kco, stride_kch, stride_kcd, stride_vcb, stride_vco, stride_vch, stride_vcd,
    num_slots, block_size, num_heads, head_dim,
    BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """Cache slots ``slots`` -> rows of contiguous ``[M, H, D]`` buffers."""
    i = (tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)).to(tl.int64)[:, None, None]  # [BLOCK_T, 1, 1]
    slot = tl.load(slot_ptr + i, mask=i < num_slots, other=-1).to(tl.int64)
    heads = tl.arange(0, BLOCK_H)[None, :, None].to(tl.int64)
    dims = tl.arange(0, BLOCK_D)[None, None, :].to(tl.int64)
    mask = (slot >= 0) & (heads < num_heads) & (dims < head_dim)
    page, offset = slot // block_size, slot % block_size
    k = tl.load(k_cache_ptr + page * stride_kcb + offset * stride_kco + heads * stride_kch + dims * stride_kcd,
                mask=mask, other=0.0)
    v = tl.load(v_cache_ptr + page * stride_vcb + offset * stride_vco + heads * stride_vch + dims * stride_vcd,
                mask=mask, other=0.0)
    dense = i * num_heads * head_dim + heads * head_dim + dims
    tl.store(k_out_ptr + dense, k, mask=mask)
    tl.store(v_out_ptr + dense, v, mask=mask)


def _tiles(count: int, num_heads: int, head_dim: int) -> tuple[int, int, int, int]:
    """(grid size, BLOCK_T, BLOCK_H, BLOCK_D) for ``count`` token rows of ``[num_heads, head_dim]``."""
    block_h, block_d = next_power_of_2(num_heads), next_power_of_2(head_dim)
    block_t = max(1, TILE_ELEMENTS // (block_h * block_d))
    return triton.cdiv(count, block_t), block_t, block_h, block_d


def _check_caches(op: str, k_cache: torch.Tensor, v_cache: torch.Tensor) -> None:
    if k_cache.dim() != 4 or k_cache.shape != v_cache.shape or k_cache.dtype != v_cache.dtype:
        raise KernelInputError(f"{op}: k_cache {k_cache.dtype} {tuple(k_cache.shape)} and v_cache "
                               f"{v_cache.dtype} {tuple(v_cache.shape)} must be equal "
                               "[num_blocks, block_size, Hkv, D]")
    check_dtype(op, "k_cache", k_cache)


def _check_slots(op: str, name: str, slots: torch.Tensor, count: int) -> torch.Tensor:
    if slots.dim() != 1 or slots.shape[0] != count or slots.dtype not in (torch.int64, torch.int32):
        raise KernelInputError(f"{op}: {name} must be int64 [{count}], got {slots.dtype} {tuple(slots.shape)}")
    return slots.contiguous()


def _cache_strides(k_cache: torch.Tensor, v_cache: torch.Tensor) -> tuple[int, ...]:
    return (*k_cache.stride(), *v_cache.stride())


def _scatter(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             slots: torch.Tensor) -> None:
    _, block_size, num_heads, head_dim = k_cache.shape
    grid, block_t, block_h, block_d = _tiles(k.shape[0], num_heads, head_dim)
    _scatter_kernel[(grid,)](
        k, v, k_cache, v_cache, slots,
        *k.stride(), *v.stride(), *_cache_strides(k_cache, v_cache),
        k.shape[0], block_size, num_heads, head_dim,
        CACHE_DTYPE=TRITON_DTYPES[k_cache.dtype], CAST_K=k.dtype != k_cache.dtype, CAST_V=v.dtype != k_cache.dtype,
        BLOCK_T=block_t, BLOCK_H=block_h, BLOCK_D=block_d,
        SOFT_BF16=interpreted(_scatter_kernel), num_warps=4,
    )


def triton_write_kv(
    k: torch.Tensor,  # [T, Hkv, D]
    v: torch.Tensor,  # [T, Hkv, D]
    k_cache: torch.Tensor,  # [num_blocks, block_size, Hkv, D]
    v_cache: torch.Tensor,  # [num_blocks, block_size, Hkv, D]
    slot_mapping: torch.Tensor,  # [T] int64
) -> None:
    """Same contract as ``hyspec.ops.kv.write_kv`` (reshape-and-cache)."""
    op = "write_kv"
    _check_caches(op, k_cache, v_cache)
    expected = (k.shape[0], *k_cache.shape[2:])
    if tuple(k.shape) != expected or tuple(v.shape) != expected:
        raise KernelInputError(f"{op}: k {tuple(k.shape)} and v {tuple(v.shape)} must be {expected}")
    check_dtype(op, "k", k)
    check_dtype(op, "v", v)
    slots = _check_slots(op, "slot_mapping", slot_mapping, k.shape[0])
    check_device(op, _scatter_kernel, k, v, k_cache, v_cache, slots)
    if k.shape[0] > 0:
        _scatter(k, v, k_cache, v_cache, slots)


def triton_compact_kv(
    k_cache: torch.Tensor,  # [num_blocks, block_size, Hkv, D]
    v_cache: torch.Tensor,  # [num_blocks, block_size, Hkv, D]
    src_slots: torch.Tensor,  # [M] int64
    dst_slots: torch.Tensor,  # [M] int64
) -> None:
    """Same contract as ``hyspec.ops.kv.compact_kv``: move ``src_slots[i] -> dst_slots[i]``.

    Two launches: every source is gathered into a scratch buffer before any
    destination is written, so overlapping moves are safe (no grid-wide
    barrier exists inside one launch).
    """
    op = "compact_kv"
    _check_caches(op, k_cache, v_cache)
    count = src_slots.shape[0] if src_slots.dim() == 1 else -1
    src = _check_slots(op, "src_slots", src_slots, count)
    dst = _check_slots(op, "dst_slots", dst_slots, count)
    check_device(op, _gather_kernel, k_cache, v_cache, src, dst)
    if count == 0:
        return
    _, block_size, num_heads, head_dim = k_cache.shape
    k_moved = torch.empty((count, num_heads, head_dim), dtype=k_cache.dtype, device=k_cache.device)
    v_moved = torch.empty_like(k_moved)
    grid, block_t, block_h, block_d = _tiles(count, num_heads, head_dim)
    _gather_kernel[(grid,)](
        k_cache, v_cache, k_moved, v_moved, src,
        *_cache_strides(k_cache, v_cache), count, block_size, num_heads, head_dim,
        BLOCK_T=block_t, BLOCK_H=block_h, BLOCK_D=block_d, num_warps=4,
    )
    _scatter(k_moved, v_moved, k_cache, v_cache, dst)
