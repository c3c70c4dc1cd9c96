"""Weight-only int4 / int8 linear layers on the CPU, on torch's own kernels.

A :class:`~hyspec.model.quant.GroupQuantized` matrix (GGUF Q4_0 / Q4_1 / Q8_0
codes, or ``--quantization int4|int8``) becomes one of:

* :class:`Int4Linear` -- ``torch.ops.aten._weight_int4pack_mm_for_cpu``:
  group-wise 4-bit codes, ``w = (q - 8) * scale + zero`` per group, exactly
  llama.cpp's Q4_0 / Q4_1 arithmetic.  The codes are repacked bit for bit.
  Activations, scales and zeros are **bf16**: torch's x86 kernel is vectorised
  (AVX2 / AVX-512) for bf16 only, its fp16 / fp32 variants are scalar loops
  ten times slower.  So the fp16 scales of the file are rounded to bf16 (a
  relative error below 2^-9 per scale, 2^-9 per weight at most; the output is
  rounded to bf16 anyway, as every bf16 matmul's is); the measured effect is
  in tests/test_cpu_ops_quantized.py and the bench's identity report.
* :class:`Int8Linear` -- ``torch.ops.aten._weight_int8pack_mm``: 8-bit codes
  with one scale per output row.  Q8_0 has a scale per 32 weights, so its
  values are requantized per row (round to nearest of the file's values:
  at most half a row step per weight); int8 from ``--quantization`` is per row
  already.

Both kernels compute every output row from its own input row in a fixed order
(torch tiles rows by 4 and accumulates along K sequentially), so verifying
n tokens in one forward gives the same logits as n one-token steps: checked
by tests/test_cpu_ops_quantized.py, as for the packed dense linears.
"""
from __future__ import annotations

import functools
import logging
import threading

import torch
from torch import nn
from torch.utils.weak import WeakIdKeyDictionary

from hyspec.model.quant import GroupQuantized, dequantize

log = logging.getLogger(__name__)

#: The activation dtype the kernels run in (see the module docstring).
KERNEL_DTYPE = torch.bfloat16


@functools.cache
def int4_kernel_available() -> bool:
    """Whether this torch build has the CPU int4 kernel and it runs (one tiny pack and multiply)."""
    try:
        codes = torch.zeros(16, 32, dtype=torch.int32)
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes, 1)
        sz = torch.ones(1, 16, 2, dtype=KERNEL_DTYPE)
        torch.ops.aten._weight_int4pack_mm_for_cpu(torch.ones(1, 32, dtype=KERNEL_DTYPE), packed, 32, sz)
    except (AttributeError, RuntimeError) as exc:
        log.info("CPU int4 kernel unavailable: %s", str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
        return False
    return True


@functools.cache
def int8_kernel_available() -> bool:
    """Whether this torch build has the CPU weight-only int8 kernel and it runs."""
    try:
        torch.ops.aten._weight_int8pack_mm(torch.ones(1, 8, dtype=KERNEL_DTYPE), torch.ones(8, 8, dtype=torch.int8),
                                           torch.ones(8, dtype=KERNEL_DTYPE))
    except (AttributeError, RuntimeError) as exc:
        log.info("CPU int8 kernel unavailable: %s", str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
        return False
    return True


def kernel_for(w: GroupQuantized) -> str | None:
    """``"int4"`` / ``"int8"`` when this CPU can compute with ``w`` as stored, else None (dequantize it)."""
    if w.q is None:  # blocks-only types (Q4_K ...): only hyspec's block kernel takes them
        return None
    n, k = w.shape
    if w.bits == 4 and int4_kernel_available() and n % 16 == 0 and k % w.group_size == 0 \
            and w.group_size in (32, 64, 128, 256):
        return "int4"
    if w.bits == 8 and int8_kernel_available():
        return "int8"
    return None


class Int4Linear(nn.Module):
    """``nn.Linear`` at inference over group-wise int4 codes (``weight`` is not kept: it is the codes)."""

    kernel = "torch int4, bf16"

    def __init__(self, w: GroupQuantized, bias: torch.Tensor | None):
        super().__init__()
        self.out_features, self.in_features = w.shape
        self.group_size, self.source = w.group_size, w.source
        self.register_buffer("packed", torch.ops.aten._convert_weight_to_int4pack_for_cpu(w.q.to(torch.int32), 1))
        # [K // G, N, 2]: (scale, zero) per group and output column, the kernel's layout
        self.register_buffer("scales_zeros", torch.stack([w.scale.t(), w.zero.t()], dim=-1).to(KERNEL_DTYPE).contiguous())
        self.bias = None if bias is None else nn.Parameter(bias.detach().to(KERNEL_DTYPE), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features).to(KERNEL_DTYPE)
        if not rows.is_contiguous():
            rows = rows.contiguous()
        out = torch.ops.aten._weight_int4pack_mm_for_cpu(rows, self.packed, self.group_size, self.scales_zeros)
        if self.bias is not None:
            out = out + self.bias
        return out.to(x.dtype).reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int4 g{self.group_size} ({self.source})"


class Int8Linear(nn.Module):
    """``nn.Linear`` at inference over int8 codes with one scale per output row."""

    kernel = "torch int8, bf16"

    def __init__(self, w: GroupQuantized, bias: torch.Tensor | None):
        super().__init__()
        self.out_features, self.in_features = w.shape
        self.source = w.source
        codes, scale = per_row_int8(w)
        self.register_buffer("codes", codes)
        self.register_buffer("scales", scale.to(KERNEL_DTYPE))
        self.bias = None if bias is None else nn.Parameter(bias.detach().to(KERNEL_DTYPE), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features).to(KERNEL_DTYPE)
        if not rows.is_contiguous():
            rows = rows.contiguous()
        out = torch.ops.aten._weight_int8pack_mm(rows, self.codes, self.scales)
        if self.bias is not None:
            out = out + self.bias
        return out.to(x.dtype).reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 per row ({self.source})"


def per_row_int8(w: GroupQuantized) -> tuple[torch.Tensor, torch.Tensor]:
    """int8 codes ``[N, K]`` and one scale per row: ``w``'s own when it has one group a row, else requantized
    (round to nearest) from its exact values."""
    if w.bits == 8 and w.group_size == w.shape[1] and not bool(w.zero.any()):
        return w.q.to(torch.int8).contiguous(), w.scale.view(-1)
    values = dequantize(w)
    scale = (values.abs().amax(dim=1) / 127).clamp_min(torch.finfo(torch.float32).tiny)
    codes = torch.round(values / scale[:, None]).clamp(-128, 127).to(torch.int8)
    return codes.contiguous(), scale


def quantized_linear(w: GroupQuantized, bias: torch.Tensor | None = None,
                     dtype: torch.dtype = KERNEL_DTYPE, activations: str = "native") -> nn.Module | None:
    """The CPU module computing with ``w`` on activations of ``dtype`` (None when no kernel here takes it).

    fp32 activations go to hyspec's own kernel over the GGML blocks (qgemm.c: exact weights, fp32
    sums) when it builds here; everything else to torch's bf16 kernels.  ``activations="int8"``
    (``quantization="a8"``): the blocks times activations rounded to 8 bits (qgemm_a8.c), fp32 only.
    Q5_0 / Q5_1 / K-quant blocks (``w.q`` None) go to the block kernel in fp32 or nowhere (None); with
    ``activations="int8"`` the types qgemm_a8 takes (Q5_0, Q5_1, Q4_K, Q5_K, Q6_K) go to it, any other keeps
    fp32 activations on the block kernel (a fused matrix: part by part; ``a8_keeps_fp32`` tells when none of it
    takes 8 bits).
    """
    if w.q is None:
        if dtype != torch.float32:
            return None
        if activations == "int8" and not a8_keeps_fp32(w):
            from hyspec.cpu_ops.qgemm_a8 import available

            if not available()[0]:
                return None
            return _stored_blocks_linear(w, bias, a8=True)
        return _stored_blocks_linear(w, bias)
    if activations == "int8":
        from hyspec.cpu_ops.qgemm import BlockLinear
        from hyspec.cpu_ops.qgemm_a8 import available
        from hyspec.model.quant import encode_blocks

        encoded = encode_blocks(w) if dtype == torch.float32 and available()[0] else None
        return None if encoded is None else BlockLinear(encoded[0], encoded[1], w.shape[1], bias, w.source, a8=True)
    if dtype == torch.float32:
        from hyspec.cpu_ops.qgemm import BlockLinear, library
        from hyspec.model.quant import encode_blocks

        encoded = encode_blocks(w) if library() is not None else None
        if encoded is not None:
            return BlockLinear(encoded[0], encoded[1], w.shape[1], bias, w.source)
    kind = kernel_for(w)
    if kind == "int4":
        return Int4Linear(w, bias)
    if kind == "int8":
        return Int8Linear(w, bias)
    return None


def a8_keeps_fp32(w: GroupQuantized) -> bool:
    """True for a blocks-only matrix that ``quantization="a8"`` leaves wholly on fp32 activations: stored in a
    type the 8-bit-activation kernel does not take, every part of it if it has parts."""
    from hyspec.cpu_ops.qgemm_a8 import A8_BLOCK_TYPES

    if w.q is not None:
        return False
    return all(p.block_type not in A8_BLOCK_TYPES for p in w.parts) if w.parts else w.block_type not in A8_BLOCK_TYPES


def _stored_blocks_linear(w: GroupQuantized, bias: torch.Tensor | None, a8: bool = False) -> nn.Module | None:
    """hyspec's block kernel over a blocks-only matrix, or over its parts in several types (row-concatenated).
    ``a8``: the blocks (or parts) in a type qgemm_a8 takes get 8-bit activations, the others fp32."""
    from hyspec.cpu_ops.qgemm import BLOCK_ELEMS, BlockLinear, RowConcatLinear, library
    from hyspec.cpu_ops.qgemm_a8 import A8_BLOCK_TYPES
    from hyspec.model.quant import encode_blocks

    if library() is None:
        return None
    k = w.shape[1]
    if not w.parts:
        if k % BLOCK_ELEMS[w.block_type]:
            return None
        return BlockLinear(w.block_type, w.blocks, k, bias, w.source, a8=a8 and w.block_type in A8_BLOCK_TYPES)
    modules = []
    for part in w.parts:
        encoded = encode_blocks(part)
        if encoded is None or k % BLOCK_ELEMS[encoded[0]]:
            return None
        modules.append(BlockLinear(encoded[0], encoded[1], k, None, part.source,
                                   a8=a8 and encoded[0] in A8_BLOCK_TYPES))
    return RowConcatLinear(modules, bias)


class QuantizedHeads:
    """lm_head weights (a tied embedding's too) that have a quantized stand-in, keyed weakly on the tensor.

    The ``logits`` op receives the dense weight (``CausalLM.lm_head_weight``, which the
    embedding lookup keeps using); where the loader registered a quantized copy of it
    the CPU ``logits`` op multiplies by that instead, for the target and every
    drafter that shares its head alike.
    """

    def __init__(self) -> None:
        self._heads: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self._lock = threading.Lock()

    def register(self, weight: torch.Tensor, head: nn.Module) -> None:
        with self._lock:
            self._heads[weight] = head

    def get(self, weight: torch.Tensor) -> nn.Module | None:
        return self._heads.get(weight)

    def __len__(self) -> int:
        return len(self._heads)


#: The CPU backend's quantized lm_heads.
QUANTIZED_HEADS = QuantizedHeads()


__all__ = ["Int4Linear", "Int8Linear", "KERNEL_DTYPE", "QUANTIZED_HEADS", "int4_kernel_available",
           "int8_kernel_available", "kernel_for", "per_row_int8", "quantized_linear"]
