"""Triton KV write and compaction vs the reference, on strided views of a block-major pool.

Runs on CPU under TRITON_INTERPRET=1.  The pool is laid out
``[num_blocks, layers, 2, block_size, Hkv, D]``; the ops get layer 1's views
and must leave layer 0 untouched.
"""
from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"  # before the kernel modules import triton's jit

import pytest  # noqa: E402
import torch  # noqa: E402

pytest.importorskip("triton")

from hyspec.cuda_ops.common import KernelInputError  # noqa: E402
from hyspec.cuda_ops.kv import triton_compact_kv, triton_write_kv  # noqa: E402
from hyspec.cuda_ops.tolerances import tolerance  # noqa: E402
from hyspec.ops import reference_ops  # noqa: E402

REF = reference_ops()
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def make_pool(dtype: torch.dtype, num_blocks: int = 6, block_size: int = 16, heads: int = 2, dim: int = 32,
              seed: int = 0) -> torch.Tensor:  # [num_blocks, 2 layers, 2, block_size, heads, dim]
    g = torch.Generator().manual_seed(seed)
    return torch.randn(num_blocks, 2, 2, block_size, heads, dim, generator=g).to(dtype)


def layer_views(pool: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    k_cache, v_cache = pool[:, 1, 0], pool[:, 1, 1]
    assert k_cache.stride(0) > k_cache.shape[1] * k_cache.shape[2] * k_cache.shape[3]  # really strided
    return k_cache, v_cache


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("block_size", [16, 32])
def test_write_kv_matches_reference(dtype: torch.dtype, block_size: int) -> None:
    pool = make_pool(dtype, block_size=block_size)
    expected_pool = pool.clone()
    g = torch.Generator().manual_seed(1)
    slots = torch.randperm(pool.shape[0] * block_size, generator=g)[:21]  # scattered over pages
    k = torch.randn(21, 2, 32, generator=g).to(dtype)
    v = torch.randn(21, 2, 32, generator=g).to(dtype)
    REF.write_kv(k, v, *layer_views(expected_pool), slots)
    triton_write_kv(k, v, *layer_views(pool), slots)
    tolerance("write_kv", dtype).check(pool, expected_pool, "write_kv pool (both layers)")


def test_write_kv_strided_sources_and_dtype_cast() -> None:
    """k/v sliced out of a fused projection; fp32 values rounded into a bf16 cache like Tensor.to."""
    pool = make_pool(torch.bfloat16)
    expected_pool = pool.clone()
    g = torch.Generator().manual_seed(2)
    fused = torch.randn(9, 3, 2, 32, generator=g)  # [T, q|k|v, Hkv, D] fp32
    k, v = fused[:, 1], fused[:, 2]
    slots = torch.arange(30, 39)  # crosses a page boundary at 32
    REF.write_kv(k, v, *layer_views(expected_pool), slots)
    triton_write_kv(k, v, *layer_views(pool), slots)
    tolerance("write_kv", torch.bfloat16).check(pool, expected_pool, "write_kv with cast")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("moves", [
    ([5, 6, 7, 8], [4, 5, 6, 7]),  # shift down by one: every destination is the next move's source
    ([20, 21, 22], [22, 20, 21]),  # a cycle
    ([33, 40, 47, 70], [30, 31, 32, 33]),  # an accepted tree path packed behind the context, across pages
    ([], []),
])
def test_compact_kv_reads_all_sources_first(dtype: torch.dtype, moves: tuple[list[int], list[int]]) -> None:
    pool = make_pool(dtype)
    expected_pool = pool.clone()
    src, dst = (torch.tensor(m, dtype=torch.int64) for m in moves)
    REF.compact_kv(*layer_views(expected_pool), src, dst)
    triton_compact_kv(*layer_views(pool), src, dst)
    tolerance("compact_kv", dtype).check(pool, expected_pool, f"compact_kv {moves}")


def test_rejects_inputs_it_cannot_serve() -> None:
    k_cache, v_cache = layer_views(make_pool(torch.float32))
    k = torch.zeros(3, 2, 32)
    slots = torch.arange(3)
    with pytest.raises(KernelInputError, match="must be"):
        triton_write_kv(torch.zeros(3, 2, 16), k, k_cache, v_cache, slots)
    with pytest.raises(KernelInputError, match="slot_mapping"):
        triton_write_kv(k, k, k_cache, v_cache, slots[:2])
    with pytest.raises(KernelInputError, match="slot_mapping"):
        triton_write_kv(k, k, k_cache, v_cache, slots.float())
    with pytest.raises(KernelInputError, match="v_cache"):
        triton_write_kv(k, k, k_cache, v_cache[:, :8], slots)
    with pytest.raises(KernelInputError, match="dst_slots"):
        triton_compact_kv(k_cache, v_cache, slots, slots[:2])
    with pytest.raises(KernelInputError, match="dtype"):
        triton_compact_kv(k_cache.double(), v_cache.double(), slots, slots)
