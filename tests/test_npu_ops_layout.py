"""Handing the block-major KV pool to the torch_npu paged ops: virtual-block views, scaled tables, remapped slots."""
from __future__ import annotations

import pytest
import torch

from hyspec.kv.pool import KVPool
from hyspec.npu_ops.layout import paged_cache
from hyspec.npu_ops.limits import NpuKVLayoutError


def test_pool_views_become_contiguous_virtual_blocks_over_the_same_memory() -> None:
    pool = KVPool(num_pages=5, page_bytes=KVPool.page_bytes_for(3, 2, 16, torch.bfloat16, block_size=16))
    layout = pool.register("target", num_layers=3, num_kv_heads=2, head_dim=16, dtype=torch.bfloat16)
    k_cache, v_cache = layout.caches[1]
    assert not k_cache.is_contiguous()
    cache = paged_cache(k_cache, v_cache)
    assert cache.block_stride == 6  # a page holds 3 layers x (K, V) blocks
    assert cache.key.is_contiguous() and cache.value.is_contiguous() and cache.key.shape == cache.value.shape
    assert cache.key.data_ptr() == k_cache.data_ptr() and cache.value.data_ptr() == v_cache.data_ptr()
    torch.manual_seed(0)
    k_cache.copy_(torch.randn(k_cache.shape))
    v_cache.copy_(torch.randn(v_cache.shape))
    pages = torch.tensor([[4, 0, 2]], dtype=torch.int32)
    table = cache.block_table(pages)
    assert table.dtype == torch.int32 and table.tolist() == [[24, 0, 12]]
    assert torch.equal(cache.key[table[0].long()], k_cache[pages[0].long()])
    assert torch.equal(cache.value[table[0].long()], v_cache[pages[0].long()])
    slots = torch.tensor([4 * 16 + 3, 0, 2 * 16 + 15])
    virtual = cache.slots(slots)
    bs = 16
    assert torch.equal(cache.key[virtual // bs, virtual % bs], k_cache[slots // bs, slots % bs])
    cache.value[virtual // bs, virtual % bs] = 7.0  # writes through the virtual view land in the pool
    assert (v_cache[slots // bs, slots % bs] == 7.0).all()


def test_a_contiguous_cache_passes_unchanged() -> None:
    k, v = torch.zeros(4, 16, 2, 8), torch.zeros(4, 16, 2, 8)
    cache = paged_cache(k, v)
    assert cache.key is k and cache.value is v and cache.block_stride == 1
    assert torch.equal(cache.slots(torch.tensor([5, 63])), torch.tensor([5, 63]))


def test_a_page_that_is_not_whole_blocks_is_refused_with_the_pool_requirement() -> None:
    """A drafter layout whose block does not tile the shared page cannot be indexed by block id."""
    page = KVPool.page_bytes_for(2, 2, 16, torch.bfloat16, block_size=16) + 64  # 64 bytes of slack
    pool = KVPool(num_pages=3, page_bytes=page)
    layout = pool.register("drafter", num_layers=1, num_kv_heads=2, head_dim=16, dtype=torch.bfloat16,
                           block_size=16)
    with pytest.raises(NpuKVLayoutError, match="page size that is a multiple of block_size\\*Hkv\\*D\\*2 bytes"):
        paged_cache(*layout.caches[0])


def test_mismatched_k_and_v_are_refused() -> None:
    pool = torch.zeros(4, 2, 2, 16, 2, 8)
    with pytest.raises(NpuKVLayoutError, match="same page pitch"):
        paged_cache(pool[:, 0, 0], torch.zeros(4, 3, 2, 16, 2, 8)[:, 0, 1])  # another page pitch
    with pytest.raises(NpuKVLayoutError, match="must match"):
        paged_cache(pool[:, 0, 0], pool[:, 0, 1].half())
    with pytest.raises(NpuKVLayoutError, match="must be \\[num_blocks"):
        paged_cache(pool[:, 0, 0, 0], pool[:, 0, 1, 0])
