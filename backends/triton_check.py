"""Can Triton compile for a CUDA device?  Compile and run one tiny kernel there to find out.

Imported only when a CUDA device exists (it imports triton at module level),
so the probe never pays for triton on a CPU box.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _add_one(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(y_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) + 1, mask=mask)


def triton_compiles_on(device: torch.device) -> str | None:
    """None when a kernel compiled and gave the right answer on ``device``, else the reason."""
    try:
        x = torch.arange(8, device=device, dtype=torch.int32)  # [8]
        y = torch.empty_like(x)
        _add_one[(1,)](x, y, x.numel(), BLOCK=8)
        if not torch.equal(y.cpu(), torch.arange(1, 9, dtype=torch.int32)):
            return "a test kernel compiled but computed the wrong result"
    except Exception as exc:  # compiler missing, unsupported arch, driver error: all mean "cannot"
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        return f"{type(exc).__name__}: {first_line}"
    return None
