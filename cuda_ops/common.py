"""What every Triton op wrapper shares: device checks, dtype maps and exact casts.

This module imports triton, so only the kernel modules import it (lazily, via
``hyspec.cuda_ops.cuda_op_overrides``).  Whether a ``@triton.jit`` function
runs compiled or interpreted is fixed when its module is imported: set
``TRITON_INTERPRET=1`` before that to run the kernels on CPU tensors.
"""
from __future__ import annotations

import contextlib
from typing import Iterator

import torch
import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction

from hyspec.errors import HyspecError

#: Activation / cache dtypes the kernels serve.
SUPPORTED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)

TRITON_DTYPES = {torch.float32: tl.float32, torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}


class KernelInputError(HyspecError):
    """An op was called with inputs its Triton kernel cannot serve (raised before launch)."""


def interpreted(kernel: object) -> bool:
    """True when ``kernel`` was decorated under ``TRITON_INTERPRET=1`` (runs on CPU tensors)."""
    return isinstance(kernel, InterpretedFunction)


@contextlib.contextmanager
def interpreter_launches() -> Iterator[list[tuple]]:
    """Inside: every interpreted Triton launch is recorded as (kernel, grid, scalar args, constexprs and launch
    options) and still runs.  What a recorded CUDA graph replays is exactly this list: two steps under one
    graph must produce equal lists (hyspec.graph_capture.ReexecutingCapturer compares them).

    Process-wide (it patches the interpreter's launch): one recording at a time, on the calling thread.
    """
    launches: list[tuple] = []
    original = InterpretedFunction.run

    def record(self, *args, grid, warmup, **kwargs):
        scalars = tuple(a for a in args if not isinstance(a, torch.Tensor))
        launches.append((self.fn.__name__, grid, scalars, tuple(sorted((k, str(v)) for k, v in kwargs.items()))))
        return original(self, *args, grid=grid, warmup=warmup, **kwargs)

    InterpretedFunction.run = record
    try:
        yield launches
    finally:
        InterpretedFunction.run = original


def check_device(op: str, kernel: object, *tensors: torch.Tensor) -> None:
    """All tensors on one device that ``kernel`` can run on: CUDA, or CPU under the interpreter."""
    devices = {t.device for t in tensors}
    if len(devices) != 1:
        raise KernelInputError(f"{op}: tensors are on different devices {sorted(map(str, devices))}")
    device = devices.pop()
    if interpreted(kernel):
        if device.type != "cpu":
            raise KernelInputError(f"{op}: the kernels were imported under TRITON_INTERPRET=1 and need CPU "
                                   f"tensors, got {device}")
    elif device.type != "cuda":
        raise KernelInputError(f"{op}: the Triton kernel needs CUDA tensors, got {device}; to run it on the "
                               "CPU set TRITON_INTERPRET=1 before hyspec.cuda_ops kernels are imported")


def check_dtype(op: str, name: str, tensor: torch.Tensor) -> None:
    if tensor.dtype not in SUPPORTED_DTYPES:
        raise KernelInputError(f"{op}: {name} has dtype {tensor.dtype}; supported: "
                               f"{[str(d) for d in SUPPORTED_DTYPES]}")


def next_power_of_2(n: int) -> int:
    return triton.next_power_of_2(max(int(n), 1))


@triton.jit
def round_to(x, DTYPE: tl.constexpr, SOFT_BF16: tl.constexpr):
    """Round fp32 ``x`` to ``DTYPE`` to nearest-even, as torch does; the result is still of ``DTYPE``.

    The interpreter's fp32->bf16 cast truncates (triton 3.9), so under
    ``SOFT_BF16`` the bf16 rounding is done on the bits (finite values, which
    is all the kernels produce).  On the GPU the hardware conversion rounds to
    nearest-even already.
    """
    if DTYPE == tl.bfloat16 and SOFT_BF16:
        bits = x.to(tl.uint32, bitcast=True)
        bits = bits + 0x7FFF + ((bits >> 16) & 1)
        return (bits >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)
    else:
        return x.to(DTYPE)


@triton.jit
def round_trip(x, DTYPE: tl.constexpr, SOFT_BF16: tl.constexpr):
    """``x`` rounded to ``DTYPE`` and back to fp32: one torch op's result in that dtype."""
    if DTYPE == tl.float32:
        return x
    else:
        return round_to(x, DTYPE, SOFT_BF16).to(tl.float32)
