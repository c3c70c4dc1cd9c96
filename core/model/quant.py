"""Weight-only quantized matrices, vendor-neutral: what the loader hands a backend's kernels.

A :class:`GroupQuantized` matrix ``[N, K]`` stores integer codes ``q`` and, per
row and per group of ``group_size`` columns, a ``scale`` and a ``zero``:

    w[n, k] = (q[n, k] - offset) * scale[n, k // G] + zero[n, k // G]

with ``offset`` 8 for 4-bit codes (0..15) and 0 for 8-bit codes (-128..127).
That is torch's group-wise int4 convention, and llama.cpp's blocks map onto
it exactly:

* Q4_0 (``w = d * (q - 8)``): scale ``d``, zero 0;
* Q4_1 (``w = d * q + m``): scale ``d``, zero ``m + 8 d`` (computed in fp32,
  where the sum of two fp16 values is exact unless their exponents are more
  than 13 apart: :func:`from_gguf` checks it and reports the tensor);
* Q8_0 (``w = d * q``, q int8): scale ``d``, zero 0, offset 0.

The codes are the file's own; a backend that computes with them reads 4.5 or
8.5 bits a weight instead of 16.

Q5_0, Q5_1 and the K-quants Q4_K, Q5_K, Q6_K (what a Q4_K_M / Q5_K_M file holds
besides those) are kept as their blocks only (:func:`stored_blocks`): ``q``,
``scale`` and ``zero`` are None, their values are gguf's own dequantization
(:func:`dequantize`), and a backend computes with them as stored or not at all.
A fused matrix whose parts are stored in different types (Q4_K q/k with a Q6_K
v) keeps its parts (``parts``) rather than converting any of them.  Where a backend's kernel wants another
layout (per-channel int8 scales, bf16 scales) it converts, and says how exact
the conversion is (hyspec.cpu_ops.quantized_linear).

:func:`quantize` makes the same structure from a dense bf16/fp32 matrix
(``--quantization int4|int8``): llama.cpp's Q4_1 (asymmetric min/max) and
Q8_0 (symmetric) per group of 32 with fp16 scales, so :func:`encode_blocks`
can write any of them as GGML blocks for a kernel that reads those.  :func:`dequantize` is the reference every kernel is
tested against.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from hyspec.errors import CheckpointError

#: GGML block types hyspec can keep quantized, and the bits of their codes.
GGUF_GROUP_TYPES = {"Q4_0": 4, "Q4_1": 4, "Q8_0": 8}
_GGUF_BLOCK = 32  # the block (group) size of Q4_0, Q4_1 and Q8_0
#: GGML types kept as their stored blocks only: (bits of a code, weights per scale, weights per block, bytes per block)
GGUF_STORED_TYPES = {"Q5_0": (5, 32, 32, 22), "Q5_1": (5, 32, 32, 24), "Q4_K": (4, 32, 256, 144),
                     "Q5_K": (5, 32, 256, 176), "Q6_K": (6, 16, 256, 210)}


@dataclass
class GroupQuantized:
    """An ``[N, K]`` matrix as integer codes with group-wise scales and zeros (see the module docstring)."""

    q: torch.Tensor | None  # [N, K] uint8 codes 0..15 (bits 4) or int8 -128..127 (bits 8); None: blocks only
    scale: torch.Tensor | None  # [N, K // group_size] fp32
    zero: torch.Tensor | None  # [N, K // group_size] fp32
    group_size: int
    bits: int
    source: str  # where the codes came from: a GGML type (Q4_1 ...) or "int4" / "int8" (quantized here)
    blocks: torch.Tensor | None = None  # [N, bytes per row] uint8: the GGML blocks these values are (if known)
    block_type: str | None = None  # their GGML type: Q4_0, Q4_1, Q8_0, or one of GGUF_STORED_TYPES
    dims: tuple[int, int] | None = None  # (N, K) of a blocks-only matrix (q is None)
    parts: tuple[GroupQuantized, ...] = ()  # row-wise parts stored in different types (blocks and q None)

    @property
    def shape(self) -> tuple[int, int]:
        if self.q is None:
            return self.dims
        return int(self.q.shape[0]), int(self.q.shape[1])

    @property
    def offset(self) -> int:
        return 8 if self.bits == 4 else 0


def dequantize(w: GroupQuantized) -> torch.Tensor:
    """The reference values ``[N, K]`` in fp32, computed as the module docstring's formula says (blocks-only
    types: the gguf package's dequantization of the blocks)."""
    if w.parts:
        return torch.cat([dequantize(p) for p in w.parts])
    n, k = w.shape
    if w.q is None:
        from gguf import GGMLQuantizationType, quants

        values = quants.dequantize(w.blocks.numpy(), getattr(GGMLQuantizationType, w.block_type))
        return torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32).reshape(n, k))
    codes = w.q.to(torch.float32).view(n, k // w.group_size, w.group_size) - w.offset
    return (codes * w.scale[..., None] + w.zero[..., None]).view(n, k)


def concat_rows(parts: list[GroupQuantized]) -> GroupQuantized | None:
    """Row-wise concatenation (fused q/k/v and gate/up); None when the parts are not alike.  Parts kept as
    blocks (one of them blocks-only) concatenate their blocks when of one type, else stay ``parts``."""
    first = parts[0]
    if any(p.q is None for p in parts):
        if any(p.blocks is None and not p.parts for p in parts) or any(p.shape[1] != first.shape[1] for p in parts):
            return None
        dims = (sum(p.shape[0] for p in parts), first.shape[1])
        sources = "+".join(sorted({p.source for p in parts}))
        if all(p.block_type == first.block_type and p.blocks is not None for p in parts):
            return GroupQuantized(None, None, None, first.group_size, first.bits, sources,
                                  torch.cat([p.blocks for p in parts]), first.block_type, dims)
        flat = tuple(q for p in parts for q in (p.parts or (p,)))
        return GroupQuantized(None, None, None, first.group_size, max(p.bits for p in parts), sources,
                              dims=dims, parts=flat)
    if any(p.bits != first.bits or p.group_size != first.group_size or p.shape[1] != first.shape[1] for p in parts):
        return None
    sources = sorted({p.source for p in parts})
    same_blocks = all(p.blocks is not None and p.block_type == first.block_type for p in parts)
    return GroupQuantized(torch.cat([p.q for p in parts]), torch.cat([p.scale for p in parts]),
                          torch.cat([p.zero for p in parts]), first.group_size, first.bits, "+".join(sources),
                          torch.cat([p.blocks for p in parts]) if same_blocks else None,
                          first.block_type if same_blocks else None)


def permute_rows(w: GroupQuantized, rows: torch.Tensor) -> GroupQuantized:
    """The same matrix with its rows reordered (llama.cpp's q/k RoPE order back to Hugging Face's)."""
    if w.parts:
        raise ValueError("permute_rows: a matrix of parts in several types is permuted part by part, before joining")
    if w.q is None:
        return GroupQuantized(None, None, None, w.group_size, w.bits, w.source, w.blocks[rows].contiguous(),
                              w.block_type, w.dims)
    return GroupQuantized(w.q[rows], w.scale[rows], w.zero[rows], w.group_size, w.bits, w.source,
                          None if w.blocks is None else w.blocks[rows].contiguous(), w.block_type)


def encode_blocks(w: GroupQuantized) -> tuple[str, torch.Tensor] | None:
    """``w`` as GGML blocks ``[N, bytes per row]`` (Q4_1 for 4-bit codes, Q8_0 for 8-bit), when its group size is
    32 and its scales (and ``zero - 8 scale`` offsets) are fp16 values; None otherwise (and for parts in
    several types).  A blocks-only matrix is its own blocks."""
    if w.blocks is not None:
        return w.block_type, w.blocks
    if w.q is None:
        return None
    n, k = w.shape
    if w.group_size != _GGUF_BLOCK:
        return None
    d = w.scale.to(torch.float16)
    if w.bits == 8:
        if bool(w.zero.any()) or not torch.equal(d.float(), w.scale):
            return None
        codes = w.q.to(torch.int8).view(n, k // 32, 32).view(torch.uint8)
        return "Q8_0", torch.cat([d.view(n, -1, 1).view(torch.uint8), codes], dim=-1).reshape(n, -1)
    m = (w.zero - 8 * w.scale).to(torch.float16)
    if not (torch.equal(d.float(), w.scale) and torch.equal(m.float() + 8 * d.float(), w.zero)):
        return None
    q = w.q.to(torch.uint8).view(n, k // 32, 32)
    nibbles = q[..., :16] | (q[..., 16:] << 4)
    return "Q4_1", torch.cat([d.view(n, -1, 1).view(torch.uint8), m.view(n, -1, 1).view(torch.uint8), nibbles],
                             dim=-1).reshape(n, -1)


def from_gguf(qtype: str, blocks: np.ndarray, shape: tuple[int, int], name: str = "") -> GroupQuantized | None:
    """A GGUF tensor's raw blocks as codes + scales + zeros, exactly; None for types not in GGUF_GROUP_TYPES."""
    if qtype not in GGUF_GROUP_TYPES:
        return None
    n, k = shape
    if k % _GGUF_BLOCK:
        raise CheckpointError(f"{name}: {qtype} tensor with {k} columns is not a whole number of blocks")
    raw = np.ascontiguousarray(blocks).reshape(n, k // _GGUF_BLOCK, -1)
    kept = torch.from_numpy(raw.reshape(n, -1).copy())  # the file's bytes, for kernels that read them as they are
    d = torch.from_numpy(raw[..., 0:2].copy().view(np.float16).astype(np.float32)).view(n, -1)
    if qtype == "Q8_0":
        codes = torch.from_numpy(raw[..., 2:].copy().view(np.int8)).reshape(n, k)
        return GroupQuantized(codes, d, torch.zeros_like(d), _GGUF_BLOCK, 8, qtype, kept, qtype)
    start = 4 if qtype == "Q4_1" else 2
    packed = torch.from_numpy(raw[..., start:].copy())  # [n, blocks, 16]: element j low nibble, j + 16 high
    codes = torch.cat([packed & 0x0F, packed >> 4], dim=-1).reshape(n, k)
    if qtype == "Q4_0":
        return GroupQuantized(codes, d, torch.zeros_like(d), _GGUF_BLOCK, 4, qtype, kept, qtype)
    m = torch.from_numpy(raw[..., 2:4].copy().view(np.float16).astype(np.float32)).view(n, -1)
    zero = m + 8 * d
    # fp32 holds m + 8d exactly unless the exponents are far apart; then w's formula rounds once more
    exact = (zero.double() == m.double() + 8 * d.double()).all()
    if not bool(exact):
        import logging

        logging.getLogger(__name__).info("%s: Q4_1 zero m + 8d rounded in fp32 for some blocks", name)
    return GroupQuantized(codes, d, zero, _GGUF_BLOCK, 4, qtype, kept, qtype)


def stored_blocks(qtype: str, blocks: np.ndarray, shape: tuple[int, int], name: str = "") -> GroupQuantized | None:
    """A GGUF tensor of one of GGUF_STORED_TYPES as its blocks only (values: :func:`dequantize`); None for
    other types."""
    if qtype not in GGUF_STORED_TYPES:
        return None
    bits, group, elems, nbytes = GGUF_STORED_TYPES[qtype]
    n, k = shape
    if k % elems:
        raise CheckpointError(f"{name}: {qtype} tensor with {k} columns is not a whole number of {elems}-weight blocks")
    raw = np.ascontiguousarray(blocks).reshape(n, -1)
    if raw.shape[1] != k // elems * nbytes:
        raise CheckpointError(f"{name}: {qtype} tensor of {raw.shape[1]} bytes a row does not hold {k} columns")
    return GroupQuantized(None, None, None, group, bits, qtype, torch.from_numpy(raw.copy()), qtype, (n, k))


def quantize(w: torch.Tensor, bits: int, group_size: int = 32) -> GroupQuantized:
    """Weight-only quantization of a dense ``[N, K]`` matrix, group-wise, llama.cpp's Q4_1 / Q8_0 formats.

    int4: per group, ``d = (max - min) / 15`` and ``m = min`` (both rounded to fp16, as a GGUF stores
    them), codes ``round((w - m) / d)`` clamped to 0..15.  int8: per group, ``d = absmax / 127`` (fp16),
    codes ``round(w / d)``.  The codes are chosen against the fp16 scales, so the error is at most half
    a step per weight (plus the fp16 rounding of ``m``).
    """
    w = w.detach().to(torch.float32)
    n, k = w.shape
    if bits not in (4, 8):
        raise ValueError(f"weight-only quantization supports 4 or 8 bits, not {bits}")
    if k % group_size:
        raise ValueError(f"int{bits} quantization needs columns ({k}) divisible by the group size ({group_size})")
    groups = w.view(n, k // group_size, group_size)
    tiny = torch.finfo(torch.float16).tiny
    if bits == 8:
        d = (groups.abs().amax(dim=-1) / 127).clamp_min(tiny).to(torch.float16).float()
        codes = torch.round(groups / d[..., None]).clamp(-128, 127).to(torch.int8).view(n, k)
        return GroupQuantized(codes, d, torch.zeros_like(d), group_size, 8, "int8")
    lo, hi = groups.amin(dim=-1), groups.amax(dim=-1)
    d = ((hi - lo) / 15).clamp_min(tiny).to(torch.float16).float()
    m = lo.to(torch.float16).float()
    codes = torch.round((groups - m[..., None]) / d[..., None]).clamp(0, 15).to(torch.uint8).view(n, k)
    return GroupQuantized(codes, d, m + 8 * d, group_size, 4, "int4")


__all__ = ["GGUF_GROUP_TYPES", "GGUF_STORED_TYPES", "GroupQuantized", "concat_rows", "dequantize", "encode_blocks",
           "from_gguf", "permute_rows", "quantize", "stored_blocks"]
