"""Reference KV-cache writes and compaction (slot = block * block_size + offset)."""
from __future__ import annotations

import torch


def write_kv(
    k: torch.Tensor,  # [T, Hkv, D]
    v: torch.Tensor,  # [T, Hkv, D]
    k_cache: torch.Tensor,  # [num_blocks, block_size, Hkv, D]
    v_cache: torch.Tensor,  # [num_blocks, block_size, Hkv, D]
    slot_mapping: torch.Tensor,  # [T] int64
) -> None:
    """Store each new token's key and value at its slot (reshape-and-cache)."""
    block_size = k_cache.shape[1]
    blocks = slot_mapping // block_size
    offsets = slot_mapping % block_size
    k_cache[blocks, offsets] = k.to(k_cache.dtype)
    v_cache[blocks, offsets] = v.to(v_cache.dtype)


def compact_kv(
    k_cache: torch.Tensor,  # [num_blocks, block_size, Hkv, D]
    v_cache: torch.Tensor,
    src_slots: torch.Tensor,  # [M] int64
    dst_slots: torch.Tensor,  # [M] int64
) -> None:
    """Move entries ``src_slots[i] -> dst_slots[i]`` (accepted tree path into place).

    All sources are read before any destination is written, so overlapping
    moves (a node moving into a slot another accepted node vacates) are safe.
    """
    if src_slots.numel() == 0:
        return
    block_size = k_cache.shape[1]
    sb, so = src_slots // block_size, src_slots % block_size
    db, do = dst_slots // block_size, dst_slots % block_size
    k_src = k_cache[sb, so].clone()
    v_src = v_cache[sb, so].clone()
    k_cache[db, do] = k_src
    v_cache[db, do] = v_src
