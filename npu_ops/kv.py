"""hyspec's ``write_kv`` on torch_npu: ``npu_scatter_pa_kv_cache`` (aclnn), else ATB ``_npu_reshape_and_cache``.

NOT EXECUTED ON ASCEND HARDWARE (tested on CPU against hyspec.npu_ops.emulation).

Both ops write ``key[i]`` to slot ``slot_mapping[i]`` of a contiguous
``[num_blocks, block_size, Hkv, D]`` cache in place; hyspec's strided pool
views are handed over as virtual-block views with remapped slots
(hyspec.npu_ops.layout), so the writes land in the pool itself.  vllm-ascend
calls the first with ``cache_mode="Norm"`` (ND caches; the default
``"PA_NZ"`` expects FRACTAL_NZ caches) on A2/A3 and the second on 310P.
Documented preconditions the engine already guarantees: slots within the
cache and unique within a step (duplicates are "not guaranteed correct").
"""
from __future__ import annotations

from typing import Callable

import torch

from hyspec.npu_ops.layout import paged_cache
from hyspec.ops.kv import write_kv as reference_write_kv

RESHAPE_AND_CACHE_DTYPES = (torch.float16, torch.bfloat16, torch.int8)


class NpuWriteKV:
    """``OpTable.write_kv`` backed by torch_npu."""

    def __init__(self, scatter_pa_kv_cache: Callable | None = None, reshape_and_cache: Callable | None = None):
        if scatter_pa_kv_cache is None and reshape_and_cache is None:
            raise ValueError("NpuWriteKV needs npu_scatter_pa_kv_cache or _npu_reshape_and_cache")
        self.scatter = scatter_pa_kv_cache
        self.reshape_and_cache = reshape_and_cache

    def __call__(
        self,
        k: torch.Tensor,  # [T, Hkv, D]
        v: torch.Tensor,  # [T, Hkv, D]
        k_cache: torch.Tensor,  # [num_blocks, block_size, Hkv, D], maybe a strided pool view
        v_cache: torch.Tensor,
        slot_mapping: torch.Tensor,  # [T] int64
    ) -> None:
        if k.shape[0] == 0:
            return
        cache = paged_cache(k_cache, v_cache)
        key = k.to(k_cache.dtype).contiguous()  # the ops take cache-dtype inputs, as the reference casts
        value = v.to(v_cache.dtype).contiguous()
        slots = cache.slots(slot_mapping)
        if self.scatter is not None:
            self.scatter(key, value, cache.key, cache.value, slots, cache_mode="Norm")
        elif k_cache.dtype in RESHAPE_AND_CACHE_DTYPES:
            self.reshape_and_cache(key, value, cache.key, cache.value, slots.to(torch.int32))
        else:  # ATB ReshapeAndCache has no float32 kernel
            reference_write_kv(k, v, k_cache, v_cache, slot_mapping)
