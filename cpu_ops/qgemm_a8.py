"""Block matmul with 8-bit activations (qgemm_a8.c): llama.cpp's arithmetic, opted into with
``quantization="a8"``.

The exact kernel (qgemm.c) keeps activations fp32 and is bound by its FMAs once
several rows share the weights, so every verified row costs a large fraction of a
decode step.  This kernel rounds each row's activations to int8 per 32-element
block (as llama.cpp does for Q4 x Q8 dot products) and sums codes with integer
dot products; each row is still quantized and summed on its own, so plain
decoding and speculative verification agree bit for bit.  Against the fp32
reference the logits move by the activations' rounding (measured in
``scripts/check_quantized_numerics.py``), which is why it is not the default.

The weights are repacked once at load into the kernel's layout, no value changed, in about the GGUF's own
bytes: codes as nibbles plus a plane of their high bits, the K-quants' block scales a byte each beside their
super-blocks' fp16 d (the exact products are formed in the kernel).  Q4_K and Q5_K read 0.5 byte more per 32
weights than stored, blocks after the last whole group of 16 a little more.  A type not in
:data:`A8_BLOCK_TYPES` would keep fp32 activations under ``quantization="a8"``: every GGUF block type hyspec
computes with is in it.  Fast on CPUs with AVX-512 VNNI (Zen 4, Sapphire Rapids); elsewhere a portable build
gives the same bits slowly, and :func:`available` says which.

``HYSPEC_A8_PORTABLE=1`` (:data:`PORTABLE_OPT_IN`) lets :func:`available` accept the portable build: a
measurement switch, for scoring a8's quality (perplexity, agreement with the exact path) on a CPU
without VNNI, since every build gives the same bits.  It is over ten times slower than the exact kernel
(about 16x on a 512-token forward of the default model, 2-core Zen 3)
and is never chosen on its own.
"""
from __future__ import annotations

import ctypes
import functools
import logging
import os

import torch

from hyspec.cpu_ops.qgemm import BLOCK_BYTES, BLOCK_ELEMS, QTYPES

log = logging.getLogger(__name__)

#: the stored block types the a8 kernel takes (all of qgemm's); a matrix stored otherwise keeps fp32 activations
A8_BLOCK_TYPES = ("Q4_0", "Q4_1", "Q8_0", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K")
PORTABLE_OPT_IN = "HYSPEC_A8_PORTABLE"  # "1": accept the portable build (same bits, slow) -- for measurements


@functools.cache
def library() -> ctypes.CDLL | None:
    if os.environ.get("HYSPEC_QGEMM", "1") == "0":
        return None
    return variant("native")


@functools.cache
def variant(march: str) -> ctypes.CDLL | None:
    """The kernel built for ``-march=march`` (tests compare the portable build with the native one)."""
    from hyspec.cpu_ops.native import load

    lib = load("qgemm_a8.c", march)
    if lib is None:
        return None
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    lib.hyspec_qgemm_a8.restype = ctypes.c_int
    lib.hyspec_qgemm_a8.argtypes = [ctypes.c_int, ptr, i64, i64, ptr, i64, ptr]
    lib.hyspec_qgemm_a8_pack.restype = ctypes.c_int
    lib.hyspec_qgemm_a8_pack.argtypes = [ctypes.c_int, ptr, i64, i64, ptr]
    lib.hyspec_qgemm_a8_row_bytes.restype = i64
    lib.hyspec_qgemm_a8_row_bytes.argtypes = [ctypes.c_int, i64]
    lib.hyspec_qgemm_a8_isa.restype = ctypes.c_char_p
    return lib


def isa(lib: ctypes.CDLL | None = None) -> str | None:
    lib = lib or library()
    return None if lib is None else lib.hyspec_qgemm_a8_isa().decode()


def available() -> tuple[bool, str]:
    """(whether ``quantization="a8"`` can run fast here, the reason when not)."""
    lib = library()
    if lib is None:
        return False, "hyspec's qgemm_a8 kernel did not build here (see the log) or HYSPEC_QGEMM=0"
    if isa(lib) != "avx512-vnni":
        if os.environ.get(PORTABLE_OPT_IN) == "1":
            _warn_portable(isa(lib))
            return True, ""
        return False, (f"this CPU has no AVX-512 VNNI (the a8 kernel built as {isa(lib)!r}, far slower than fp32; "
                       f"{PORTABLE_OPT_IN}=1 runs it anyway, for measuring a8's quality)")
    return True, ""


@functools.cache
def _warn_portable(built_as: str) -> None:
    log.warning("%s=1: quantization='a8' runs on the %s build of qgemm_a8 (the VNNI build's bits, over ten times "
                "slower than the exact kernel): meant for measuring a8, not for serving", PORTABLE_OPT_IN, built_as)


def pack(block_type: str, blocks: torch.Tensor, n: int, k: int, lib: ctypes.CDLL | None = None) -> torch.Tensor:
    """GGUF ``blocks [n, K / block elements * block bytes]`` in the a8 kernel's layout ``[n, row bytes]``
    (values unchanged)."""
    lib = lib or library()
    if lib is None:
        raise RuntimeError("the hyspec qgemm_a8 kernel is not available here")
    if block_type not in A8_BLOCK_TYPES:
        raise ValueError(f"qgemm_a8: {block_type} blocks have no 8-bit-activation kernel (it takes {A8_BLOCK_TYPES})")
    qtype = QTYPES[block_type]
    rb = lib.hyspec_qgemm_a8_row_bytes(qtype, k)
    row_in = k // BLOCK_ELEMS[block_type] * BLOCK_BYTES[block_type]
    if rb < 0 or blocks.dtype != torch.uint8 or tuple(blocks.shape) != (n, row_in):
        raise ValueError(f"qgemm_a8: cannot pack {tuple(blocks.shape)} {blocks.dtype} as a {n}x{k} {block_type} matrix")
    src = blocks.contiguous()
    out = torch.empty(n, rb, dtype=torch.uint8)
    if lib.hyspec_qgemm_a8_pack(qtype, src.data_ptr(), n, k, out.data_ptr()) != 0:
        raise RuntimeError("hyspec_qgemm_a8_pack rejected its arguments")
    return out


def qgemm_a8(block_type: str, x: torch.Tensor, packed: torch.Tensor, n: int,
             lib: ctypes.CDLL | None = None) -> torch.Tensor:
    """``x [M, K] fp32`` times the ``[n, K]`` matrix :func:`pack` made -> ``[M, n]`` fp32."""
    lib = lib or library()
    if lib is None:
        raise RuntimeError("the hyspec qgemm_a8 kernel is not available here")
    m, k = x.shape
    if x.dtype != torch.float32 or not x.is_contiguous() or packed.dtype != torch.uint8 or not packed.is_contiguous():
        raise ValueError("qgemm_a8 needs a contiguous fp32 x and the contiguous uint8 packed matrix")
    qtype = QTYPES[block_type]
    if k % 32 or tuple(packed.shape) != (n, lib.hyspec_qgemm_a8_row_bytes(qtype, k)):
        raise ValueError(f"qgemm_a8: a packed matrix of shape {tuple(packed.shape)} is not a {n}x{k} {block_type} one")
    y = torch.empty(m, n, dtype=torch.float32)
    rc = lib.hyspec_qgemm_a8(qtype, x.data_ptr(), m, k, packed.data_ptr(), n, y.data_ptr())
    if rc != 0:
        raise RuntimeError(f"hyspec_qgemm_a8 failed ({'out of memory' if rc == -2 else 'bad arguments'})")
    return y


__all__ = ["A8_BLOCK_TYPES", "PORTABLE_OPT_IN", "available", "isa", "library", "pack", "qgemm_a8", "variant"]
