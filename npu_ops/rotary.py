"""hyspec's ``rotary`` (NeoX layout) on torch_npu: ``npu_apply_rotary_pos_emb``, ``npu_rotary_mul``, ATB's RoPE.

NOT EXECUTED ON ASCEND HARDWARE (tested on CPU against hyspec.npu_ops.emulation).

hyspec's table is ``cos_sin_cache [max_positions, D]`` fp32 with cos in the
first half and sin in the second.  Both ops rotate in place; the reference
returns new tensors and leaves its inputs alone, so the wrapper works on a
private contiguous copy (the model's q/k are strided views of the qkv
projection, so ``contiguous()`` is that copy already).

* ``npu_apply_rotary_pos_emb(q [1, T, Hq, D], k [1, T, Hkv, D], cos, sin)``,
  ``rotary_mode="half"`` (NeoX), cos/sin ``[1, T, 1, D]`` = the half table
  repeated twice, all four in one dtype; A2/A3 document D in {64, 128}.
  This is vllm-ascend's main path for D = 128.  Used only where the
  installed signature takes ``rotary_mode`` (op-plugin >= 7.2.0; 7.0/7.1 have
  ``(query, key, cos, sin, layout='BSH')``: hyspec.npu_ops.plan).
* ``npu_rotary_mul(x [1, T, H, D], r1 = cos, r2 = sin, rotary_mode='half')``
  returns ``x * r1 + rotate_half(x) * r2`` (not in place); it exists in every
  op-plugin release hyspec knows, so it is the fallback where the fused
  q+k op cannot be called.  One call for q, one for k.
* ``_npu_rotary_embedding(positions, q [T, Hq*D], k [T, Hkv*D], D,
  cos_sin_cache, is_neox_style=True)`` takes the same half/half table, but
  the ATB wrapper (op-plugin ``RopeAtb.cpp``) caches cos/sin from the FIRST
  table it is ever given in process-wide statics and ignores the argument
  afterwards.  A target and a drafter with different RoPE would silently
  share the first one's table, so hyspec lets exactly one table (and dtype)
  use it per process and sends the others to ``npu_apply_rotary_pos_emb`` or
  the reference.
"""
from __future__ import annotations

import logging
from typing import Any, Callable

import torch

from hyspec.ops.rotary import rotary as reference_rotary

log = logging.getLogger(__name__)

APPLY_ROTARY_HEAD_DIMS = (64, 128)
ROTARY_DTYPES = (torch.float16, torch.bfloat16, torch.float32)

# The table ATB's _npu_rotary_embedding captured in this process: (source table, dtype, converted table).
_atb_table: tuple[torch.Tensor, torch.dtype, torch.Tensor] | None = None


def _private(x: torch.Tensor) -> torch.Tensor:
    """A contiguous tensor that does not alias ``x`` (the ops write into their inputs)."""
    return x.clone() if x.is_contiguous() else x.contiguous()


def claim_atb_rope_table(cos_sin_cache: torch.Tensor, dtype: torch.dtype) -> torch.Tensor | None:
    """The table to pass to _npu_rotary_embedding, or None when ATB already holds another one."""
    global _atb_table
    if _atb_table is None:
        _atb_table = (cos_sin_cache, dtype, cos_sin_cache.to(dtype).contiguous())
        return _atb_table[2]
    source, held_dtype, converted = _atb_table
    if source is cos_sin_cache and held_dtype == dtype:
        return converted
    return None


def release_atb_rope_table() -> None:
    """Forget the claim (tests; a real process cannot make ATB forget its statics)."""
    global _atb_table
    _atb_table = None


def _cos_sin(cos_sin_cache: torch.Tensor, positions: torch.Tensor,
             dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin ``[1, T, 1, D]`` in ``dtype``: each half of the table repeated to full width (NeoX)."""
    T, D = positions.shape[0], cos_sin_cache.shape[-1]
    half = D // 2
    cs = cos_sin_cache[positions]  # [T, D]
    cos = torch.cat([cs[:, :half], cs[:, :half]], dim=-1).to(dtype).view(1, T, 1, D)
    sin = torch.cat([cs[:, half:], cs[:, half:]], dim=-1).to(dtype).view(1, T, 1, D)
    return cos, sin


class NpuRotary:
    """``OpTable.rotary`` backed by torch_npu."""

    def __init__(self, apply_rotary_pos_emb: Callable | None = None, rotary_embedding: Callable | None = None,
                 rotary_mul: Callable | None = None, limits: Any = None):
        if apply_rotary_pos_emb is None and rotary_embedding is None and rotary_mul is None:
            raise ValueError("NpuRotary needs npu_apply_rotary_pos_emb, npu_rotary_mul or _npu_rotary_embedding")
        self.apply_rotary_pos_emb = apply_rotary_pos_emb
        self.rotary_embedding = rotary_embedding
        self.rotary_mul = rotary_mul
        rope = limits.limits("npu_apply_rotary_pos_emb") if limits is not None else {}
        mul = limits.limits("npu_rotary_mul") if limits is not None else {}
        self.apply_head_dims = tuple(rope.get("head_dims", APPLY_ROTARY_HEAD_DIMS))
        self.mul_max_head_dim = int(mul.get("max_head_dim", 1024))
        self.mul_head_dim_multiple = int(mul.get("head_dim_multiple", 2))
        self._warned = False

    def __call__(
        self,
        q: torch.Tensor,  # [T, Hq, D]
        k: torch.Tensor,  # [T, Hkv, D]
        positions: torch.Tensor,  # [T] int64
        cos_sin_cache: torch.Tensor,  # [max_positions, D] fp32: cos in [:, :D/2], sin in [:, D/2:]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        T, D = q.shape[0], q.shape[-1]
        usable = (q.dtype == k.dtype and q.dtype in ROTARY_DTYPES and T > 0 and cos_sin_cache.shape[-1] == D)
        if usable and self.apply_rotary_pos_emb is not None and D in self.apply_head_dims:
            cos, sin = _cos_sin(cos_sin_cache, positions, q.dtype)
            q4, k4 = _private(q).view(1, T, q.shape[1], D), _private(k).view(1, T, k.shape[1], D)
            q_out, k_out = self.apply_rotary_pos_emb(q4, k4, cos, sin, layout="BSND", rotary_mode="half")
            return q_out.view(q.shape), k_out.view(k.shape)
        if (usable and self.rotary_mul is not None and D <= self.mul_max_head_dim
                and D % self.mul_head_dim_multiple == 0):
            cos, sin = _cos_sin(cos_sin_cache, positions, q.dtype)
            q_out = self.rotary_mul(q.contiguous().view(1, T, q.shape[1], D), cos, sin, rotary_mode="half")
            k_out = self.rotary_mul(k.contiguous().view(1, T, k.shape[1], D), cos, sin, rotary_mode="half")
            return q_out.view(q.shape), k_out.view(k.shape)
        table = claim_atb_rope_table(cos_sin_cache, q.dtype) if usable and self.rotary_embedding else None
        if table is not None:
            q2, k2 = _private(q).view(T, -1), _private(k).view(T, -1)
            self.rotary_embedding(positions, q2, k2, D, table, True)
            return q2.view(q.shape), k2.view(k.shape)
        if usable and self.rotary_embedding is not None and not self._warned:
            self._warned = True
            log.warning("a second RoPE table (or dtype) met ATB _npu_rotary_embedding, which keeps the first one it "
                        "saw for the whole process; this model's rotary runs on the reference op")
        return reference_rotary(q, k, positions, cos_sin_cache)
