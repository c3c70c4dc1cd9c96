"""Handing hyspec's paged KV caches to the torch_npu paged ops without copying them.

What the ops need.  FIA (``npu_fused_infer_attention_score`` with
``block_table``), ATB ``_npu_paged_attention``, ``npu_scatter_pa_kv_cache``
and ATB ``_npu_reshape_and_cache`` all index a per-layer cache
``[num_blocks, block_size, Hkv, D]`` (FIA: the same memory viewed as
``[num_blocks, block_size, Hkv * D]``) by block id, and none takes a strided
tensor: FIA and scatter document "不支持非连续的Tensor", and the ATB wrappers
call ``tensor.contiguous()`` on every input (op-plugin ``AtbCommon.cpp``,
``ParamSetter::Input``), which for a strided cache means a full copy per
call -- and for the in-place KV write, a write into that copy, i.e. lost.

What hyspec has.  ``KVPool`` is block-major: page ``p`` holds
``[layers, 2, block_size, Hkv, D]`` of its owner, so a layer's ``k_cache`` is
the strided view with block stride ``page_elems`` (= ``G`` blocks of
``block_size * Hkv * D`` elements when the page is tiled exactly).

The bridge.  Reinterpret the pool as a sequence of *virtual blocks* of
``block_size * Hkv * D`` elements starting at the layer's K (or V) offset:
that view is contiguous (only its storage offset differs), and page ``p`` of
this layer is virtual block ``p * G`` in both the K and the V view.  So the
ops receive contiguous per-layer caches, block tables multiplied by ``G`` and
slots remapped to ``(slot // block_size) * G * block_size + slot %
block_size``; nothing is copied and every layer shares the pool.

Requirement on the pool (checked here, raised as NpuKVLayoutError): a
layer's page pitch must be a whole number of its blocks -- ``page_bytes`` a
multiple of ``block_size * Hkv * D * element_size`` for every layout that
runs on the NPU -- and K and V views must share that pitch.  A contiguous
``[num_blocks, block_size, Hkv, D]`` cache (``G = 1``) passes unchanged.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from hyspec.npu_ops.limits import NpuKVLayoutError

INT32_MAX = 2**31 - 1


@dataclass(frozen=True)
class PagedCache:
    """One layer's K and V as contiguous virtual-block tensors the NPU ops can index."""

    key: torch.Tensor  # [num_virtual_blocks, block_size, Hkv, D], contiguous
    value: torch.Tensor  # [num_virtual_blocks, block_size, Hkv, D], contiguous, same shape as key
    block_stride: int  # G: page p is virtual block p * G

    @property
    def block_size(self) -> int:
        return int(self.key.shape[1])

    def key_bsh(self) -> torch.Tensor:  # [num_virtual_blocks, block_size, Hkv * D], FIA's paged layout
        return self.key.view(self.key.shape[0], self.block_size, -1)

    def value_bsh(self) -> torch.Tensor:
        return self.value.view(self.value.shape[0], self.block_size, -1)

    def block_table(self, block_tables: torch.Tensor) -> torch.Tensor:  # [B, nb] -> [B, nb] int32 contiguous
        table = block_tables.to(torch.int32)
        return (table * self.block_stride) if self.block_stride != 1 else table.contiguous()

    def slots(self, slot_mapping: torch.Tensor) -> torch.Tensor:  # [T] -> [T] int64 virtual slots
        if self.block_stride == 1:
            return slot_mapping.to(torch.int64)
        bs = self.block_size
        slot = slot_mapping.to(torch.int64)
        return (slot // bs) * (self.block_stride * bs) + slot % bs


def paged_cache(k_cache: torch.Tensor, v_cache: torch.Tensor) -> PagedCache:
    """The virtual-block views of ``k_cache``/``v_cache`` (``[num_blocks, block_size, Hkv, D]``, maybe strided)."""
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        if t.dim() != 4:
            raise NpuKVLayoutError(f"{name} must be [num_blocks, block_size, Hkv, D], got shape {tuple(t.shape)}")
    if k_cache.shape != v_cache.shape or k_cache.dtype != v_cache.dtype or k_cache.device != v_cache.device:
        raise NpuKVLayoutError(f"k_cache {tuple(k_cache.shape)} {k_cache.dtype} {k_cache.device} and v_cache "
                               f"{tuple(v_cache.shape)} {v_cache.dtype} {v_cache.device} must match")
    if k_cache.is_contiguous() and v_cache.is_contiguous():
        return PagedCache(key=k_cache, value=v_cache, block_stride=1)
    num_blocks, bs, hkv, d = k_cache.shape
    block_elems = bs * hkv * d
    if k_cache.stride() != v_cache.stride():
        raise NpuKVLayoutError(f"k_cache strides {k_cache.stride()} != v_cache strides {v_cache.stride()}: the NPU "
                               "ops use one block table for both, so K and V need the same page pitch")
    pitch = k_cache.stride(0)
    inner_ok = k_cache.stride()[1:] == (hkv * d, d, 1)
    if not inner_ok or pitch < block_elems or pitch % block_elems:
        raise NpuKVLayoutError(
            f"KV cache view with strides {k_cache.stride()} cannot be handed to the torch_npu paged ops: each "
            f"block's [block_size={bs}, Hkv={hkv}, D={d}] must be contiguous and the page pitch ({pitch} elements) "
            f"a whole number of blocks ({block_elems} elements). Give this model's KV layout a page size that is "
            f"a multiple of block_size*Hkv*D*{k_cache.element_size()} bytes (or a layer-contiguous cache)")
    stride = pitch // block_elems
    virtual = (num_blocks - 1) * stride + 1  # the highest page, (num_blocks - 1) * G, is the last block addressed
    if virtual * bs > INT32_MAX:
        raise NpuKVLayoutError(f"{virtual} virtual blocks of {bs} tokens overflow the ops' int32 block/slot ids")
    shape, strides = (virtual, bs, hkv, d), (block_elems, hkv * d, d, 1)
    key = k_cache.as_strided(shape, strides, k_cache.storage_offset())
    value = v_cache.as_strided(shape, strides, v_cache.storage_offset())
    return PagedCache(key=key, value=value, block_stride=stride)
