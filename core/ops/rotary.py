"""Reference rotary position embedding (NeoX / Hugging Face ``rotate_half`` layout)."""
from __future__ import annotations

import torch


def rotary(
    q: torch.Tensor,  # [T, Hq, D]
    k: torch.Tensor,  # [T, Hkv, D]
    positions: torch.Tensor,  # [T] int64
    cos_sin_cache: torch.Tensor,  # [max_positions, D] fp32: cos in [:, :D/2], sin in [:, D/2:]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate ``q`` and ``k`` by their explicit positions.

    cos/sin are cast to the activation dtype before use, as the reference
    implementation does, so bf16 results match it bit for bit.
    """
    cos, sin = _cos_sin(positions, cos_sin_cache, q.dtype)
    return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin


# Every layer of a forward rotates by the same positions: keep the last gathered cos/sin.
_memo: list = [None, None, None, None]  # positions, cache, dtype, (cos, sin)


def _cos_sin(positions: torch.Tensor, cache: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    if _memo[0] is positions and _memo[1] is cache and _memo[2] == dtype:
        return _memo[3]
    half = cache.shape[1] // 2
    cs = cache[positions]  # [T, D]
    cos = torch.cat([cs[:, :half], cs[:, :half]], dim=-1).to(dtype)[:, None, :]  # [T, 1, D]
    sin = torch.cat([cs[:, half:], cs[:, half:]], dim=-1).to(dtype)[:, None, :]
    _memo[:] = [positions, cache, dtype, (cos, sin)]
    return cos, sin


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)
