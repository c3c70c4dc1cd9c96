"""hyspec's batch-invariant dense linear for the CPU (dense_gemm.c): fp32 and bf16 weights.

Why: MKL's and oneDNN's GEMMs choose their blocking, and so the summation order, from the number
of rows, so a token's logits change in the last bits with the batch it is computed in (measured:
fp32 from 5 rows up on AMD Zen 5, fp32 and bf16 on Zen 3, bf16 on Ice Lake).  Speculative
verification then rounds differently from plain decoding and near-ties flip.  The kernel gives
every (row, output) pair the same operations in the same order whatever the batch: verification
reproduces plain decoding bit for bit, on every CPU.

Built once per machine by :mod:`hyspec.cpu_ops.native`.  No compiler, or a failed build:
:func:`library` returns None (reason logged once) and the CPU backend keeps MKL / oneDNN packing.
``HYSPEC_DENSE_GEMM=0`` turns it off (for comparisons).
"""
from __future__ import annotations

import ctypes
import functools
import logging
import os

import torch

log = logging.getLogger(__name__)

DTYPES = {torch.float32: 0, torch.bfloat16: 1}


@functools.cache
def library() -> ctypes.CDLL | None:
    """The built kernel (None when it cannot be had here; the reason is logged once)."""
    if os.environ.get("HYSPEC_DENSE_GEMM", "1") == "0":
        log.info("hyspec dense_gemm kernel disabled by HYSPEC_DENSE_GEMM=0")
        return None
    return variant("native")


@functools.cache
def variant(march: str) -> ctypes.CDLL | None:
    """The kernel built for ``-march=march`` (tests run the AVX2 and portable paths on any x86 CPU)."""
    from hyspec.cpu_ops.native import load

    lib = load("dense_gemm.c", march)
    if lib is None:
        return None
    ptr, i64 = ctypes.c_void_p, ctypes.c_int64
    lib.hyspec_dense_gemm.restype = ctypes.c_int
    lib.hyspec_dense_gemm.argtypes = [ctypes.c_int, ptr, i64, i64, ptr, i64, ptr, ptr]
    lib.hyspec_dense_gemm_isa.restype = ctypes.c_char_p
    return lib


def available(dtype: torch.dtype) -> bool:
    return dtype in DTYPES and library() is not None


def isa(lib: ctypes.CDLL | None = None) -> str | None:
    lib = lib or library()
    return None if lib is None else lib.hyspec_dense_gemm_isa().decode()


def dense_gemm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
               lib: ctypes.CDLL | None = None) -> torch.Tensor:
    """``x [M, K] @ weight[N, K].T (+ bias)`` in ``x``'s dtype, each row computed independently of M.

    ``lib``: a :func:`variant` to run instead of the native build (tests)."""
    lib = lib or library()
    if lib is None:
        raise RuntimeError("the hyspec dense_gemm kernel is not available here")
    if x.dim() != 2 or weight.dim() != 2 or x.shape[1] != weight.shape[1]:
        raise ValueError(f"dense_gemm: x {tuple(x.shape)} and weight {tuple(weight.shape)} do not multiply")
    if x.dtype not in DTYPES or weight.dtype != x.dtype or (bias is not None and bias.dtype != x.dtype):
        raise ValueError(f"dense_gemm takes fp32 or bf16 x, weight and bias of one dtype, got {x.dtype}, "
                         f"{weight.dtype}, {None if bias is None else bias.dtype}")
    if not (x.is_contiguous() and weight.is_contiguous() and (bias is None or bias.is_contiguous())):
        raise ValueError("dense_gemm needs contiguous tensors")
    m, k = x.shape
    n = weight.shape[0]
    if bias is not None and tuple(bias.shape) != (n,):
        raise ValueError(f"dense_gemm: bias of shape {tuple(bias.shape)} for {n} outputs")
    y = torch.empty(m, n, dtype=x.dtype)
    rc = lib.hyspec_dense_gemm(DTYPES[x.dtype], x.data_ptr(), m, k, weight.data_ptr(), n,
                               None if bias is None else bias.data_ptr(), y.data_ptr())
    if rc == -2:
        raise MemoryError("hyspec_dense_gemm: out of memory for its bf16 widening buffer")
    if rc != 0:
        raise RuntimeError("hyspec_dense_gemm rejected its arguments")
    return y


__all__ = ["available", "dense_gemm", "isa", "library", "variant"]
