"""hyspec's own CPU kernel for llama.cpp's blocks (qgemm.c): built once per machine, called through ctypes.

Why a kernel of our own: torch's CPU int4 kernel is vectorised for bf16 only
(scales rounded from the file's fp16, activations and outputs in bf16) and on
an AVX2 CPU it ran SmolLM2's 120 projections in 11.4 ms a token; the
kernel here reads the GGUF's blocks as they are, dequantizes every weight
exactly, accumulates in fp32, and keeps every row independent of the batch
(see qgemm.c).

Built once per machine by hyspec.cpu_ops.native.  No compiler, or a failed
build: :func:`library` returns None with the reason logged once, and the CPU
backend uses torch's kernels instead.  ``HYSPEC_QGEMM=0`` turns it off.
"""
from __future__ import annotations

import ctypes
import functools
import logging
import os

import torch
from torch import nn

log = logging.getLogger(__name__)

#: qgemm.c's type codes: Q4_0 .. Q5_0 in qgemm.c itself (Q5_0 summed as Q8_0 is, on its codes), Q5_1 .. Q6_K in
#: kquants.c (dequantized block by block to gguf's values, then summed in one fixed order), F32 a dense fp32 matrix
#: summed in that same order: the reference the kquants types are tested against bit for bit.
QTYPES = {"Q4_0": 0, "Q4_1": 1, "Q8_0": 2, "Q5_0": 3, "Q5_1": 4, "Q4_K": 5, "Q5_K": 6, "Q6_K": 7, "F32": 8}
BLOCK_BYTES = {"Q4_0": 18, "Q4_1": 20, "Q8_0": 34, "Q5_0": 22, "Q5_1": 24, "Q4_K": 144, "Q5_K": 176, "Q6_K": 210,
               "F32": 128}
#: weights per block (the K-quants' super-blocks hold 256)
BLOCK_ELEMS = {t: 256 if t.endswith("_K") else 32 for t in QTYPES}
A8_TYPES = 32  # decoder_stack.c: + a block type = that matrix in qgemm_a8's layout (8-bit activations)


@functools.cache
def library() -> ctypes.CDLL | None:
    """The built kernel (None when it cannot be had here; the reason is logged once)."""
    if os.environ.get("HYSPEC_QGEMM", "1") == "0":
        log.info("hyspec qgemm kernel disabled by HYSPEC_QGEMM=0")
        return None
    return variant("native")


@functools.cache
def variant(march: str) -> ctypes.CDLL | None:
    """The kernel built for ``-march=march`` (tests run the portable path on any x86 CPU)."""
    from hyspec.cpu_ops.native import load

    lib = load("qgemm.c", march)
    if lib is None:
        return None
    lib.hyspec_qgemm.restype = ctypes.c_int
    lib.hyspec_qgemm.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p,
                                 ctypes.c_int64, ctypes.c_void_p]
    lib.hyspec_qgemm_isa.restype = ctypes.c_char_p
    return lib


def isa(lib: ctypes.CDLL | None = None) -> str | None:
    lib = lib or library()
    return None if lib is None else lib.hyspec_qgemm_isa().decode()


def qgemm(block_type: str, x: torch.Tensor, blocks: torch.Tensor, n: int, lib: ctypes.CDLL | None = None) -> torch.Tensor:
    """``x [M, K] fp32`` times the ``[n, K]`` matrix stored as GGML ``blocks [n, K / elems * bytes]`` -> ``[M, n]``.

    ``block_type``: a key of :data:`QTYPES` (``"F32"``: ``blocks`` is a dense fp32 matrix's bytes, summed the
    way the K-quants are).  ``lib``: a :func:`variant` to run instead of the native build (tests)."""
    lib = lib or library()
    if lib is None:
        raise RuntimeError("the hyspec qgemm kernel is not available here")
    if block_type not in QTYPES:
        raise ValueError(f"qgemm: unknown block type {block_type!r}; it computes {', '.join(QTYPES)}")
    m, k = x.shape
    if x.dtype != torch.float32 or not x.is_contiguous() or blocks.dtype != torch.uint8 or not blocks.is_contiguous():
        raise ValueError("qgemm needs a contiguous fp32 x and contiguous uint8 blocks")
    elems = BLOCK_ELEMS[block_type]
    if k % elems or tuple(blocks.shape) != (n, k // elems * BLOCK_BYTES[block_type]):
        raise ValueError(f"qgemm: blocks of shape {tuple(blocks.shape)} do not hold a {n}x{k} {block_type} matrix")
    y = torch.empty(m, n, dtype=torch.float32)
    if lib.hyspec_qgemm(QTYPES[block_type], x.data_ptr(), m, k, blocks.data_ptr(), n, y.data_ptr()) != 0:
        raise RuntimeError("hyspec_qgemm rejected its arguments")
    return y


class BlockLinear(nn.Module):
    """``nn.Linear`` at inference over GGML blocks, through qgemm (fp32 math; outputs in the input's dtype).

    ``a8``: the activations are rounded to 8 bits per block and the blocks kept in qgemm_a8's layout
    (``quantization="a8"``, llama.cpp's arithmetic); ``blocks`` then holds that layout."""

    kernel = "hyspec qgemm, fp32"

    def __init__(self, block_type: str, blocks: torch.Tensor, in_features: int, bias: torch.Tensor | None,
                 source: str, a8: bool = False):
        super().__init__()
        self.block_type, self.source, self.a8 = block_type, source, a8
        self.out_features, self.in_features = int(blocks.shape[0]), in_features
        self._gemm = qgemm
        if a8:  # imported here: qgemm_a8 imports this module
            from hyspec.cpu_ops.qgemm_a8 import pack, qgemm_a8

            blocks = pack(block_type, blocks, self.out_features, in_features)
            self._gemm, self.kernel = qgemm_a8, "hyspec qgemm, int8 activations"
        self.register_buffer("blocks", blocks.contiguous())
        self.bias = None if bias is None else nn.Parameter(bias.detach().float(), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)
        if rows.dtype != torch.float32 or not rows.is_contiguous():
            rows = rows.to(torch.float32).contiguous()
        out = self._gemm(self.block_type, rows, self.blocks, self.out_features)
        if self.bias is not None:
            out += self.bias
        return out.to(x.dtype).reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, {self.block_type} blocks "
                f"({self.source}), hyspec qgemm" + (", int8 activations" if self.a8 else ""))


class RowConcatLinear(nn.Module):
    """A fused linear whose row ranges are stored in different block types (a Q4_K_M file's Q4_K q/k beside a
    Q6_K v): each part through qgemm, the outputs side by side.  Each output row is computed as in its part
    alone, so the result is as batch-invariant as the parts'.  ``descriptor`` lists the parts for the decoder
    stack (decoder_stack.c's PARTS type): their count, then type code, blocks address and rows of each."""

    def __init__(self, parts: list[BlockLinear], bias: torch.Tensor | None = None):
        super().__init__()
        if any(p.bias is not None for p in parts):
            raise ValueError("RowConcatLinear joins parts without biases (the bias is the whole's)")
        self.parts = nn.ModuleList(parts)
        self.in_features = parts[0].in_features
        self.out_features = sum(p.out_features for p in parts)
        self.bias = None if bias is None else nn.Parameter(bias.detach().float(), requires_grad=False)
        self.descriptor = torch.tensor([len(parts)] + [v for p in parts for v in
                                                       (QTYPES[p.block_type] + (A8_TYPES if p.a8 else 0),
                                                        p.blocks.data_ptr(), p.out_features)],
                                       dtype=torch.int64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.cat([p(x) for p in self.parts], dim=-1)
        return out if self.bias is None else out + self.bias.to(out.dtype)

    @property
    def a8(self) -> bool:
        """True when every part takes 8-bit activations (quantization="a8" on a matrix stored in several types)."""
        return all(p.a8 for p in self.parts)

    @property
    def kernel(self) -> str:
        """BlockLinear's names, joined when the parts mix 8-bit and fp32 activations"""
        kinds = [name for a8, name in ((True, "int8 activations"), (False, "fp32"))
                 if any(p.a8 == a8 for p in self.parts)]
        return "hyspec qgemm, " + " + ".join(kinds)

    def extra_repr(self) -> str:
        types = "+".join(p.block_type + (" (int8 activations)" if p.a8 else "") for p in self.parts)
        return f"in_features={self.in_features}, out_features={self.out_features}, {types} blocks, hyspec qgemm"


__all__ = ["BLOCK_BYTES", "BLOCK_ELEMS", "QTYPES", "BlockLinear", "RowConcatLinear", "isa", "library", "qgemm",
           "variant"]
