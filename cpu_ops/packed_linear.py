"""Linear layers prepared once for the CPU: hyspec's batch-invariant kernel, else MKL / oneDNN packing.

``F.linear`` on the CPU re-lays-out the weight on every call and, for fp32,
switches between a GEMV kernel (one row) and a GEMM kernel (several rows),
which round differently.  What a ``PackedLinear`` multiplies with, in order of
preference:

* hyspec's own kernel (``dense_gemm.c``, fp32 and bf16): every output row is
  computed with the same operations in the same order whatever the number of
  rows, on every CPU, so verifying n tokens in one forward gives bit-identical
  logits to n one-token steps and no near-tie can flip between plain and
  speculative decoding.  Measured on AMD Zen 5 (SmolLM2's projections, 2
  threads): fp32 0.5x MKL's time at 1 row and 0.9x at 128; bf16 (vdpbf16ps)
  0.5x oneDNN's at 1 row, equal at 8, 2x at 128 (prefill).
* where it cannot be built (no C compiler): bf16 weights in oneDNN's blocked
  layout (``mkldnn._reorder_linear_weight`` / ``mkldnn._linear_pointwise``),
  fp32 weights in MKL's packed format (``mkl._mkl_reorder_linear_weight`` /
  ``mkl._mkl_linear``).  Their blocking depends on the row count on some CPUs
  (fp32 from 5 rows on AMD Zen 5; bf16 on CPUs without native bf16), which the
  measured near-tie rule of ``core/numerics.py`` then covers.

Other dtypes, and torch builds without these ops, keep ``F.linear``.
"""
from __future__ import annotations

import functools
import logging
import threading
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.weak import WeakIdKeyDictionary

log = logging.getLogger(__name__)

_PACK_BATCH_HINT = 4  # the row count the packing is tuned for (decode and small verifications)


def packing_available(dtype: torch.dtype) -> bool:
    """Whether this torch build, on this CPU, can prepare weights of ``dtype`` (either way above)."""
    if invariant_kernel_available(dtype):
        return True
    if dtype == torch.bfloat16:
        return _bf16_packing_runs()
    if dtype == torch.float32:
        return torch.backends.mkl.is_available() and hasattr(torch.ops.mkl, "_mkl_linear")
    return False


def invariant_kernel_available(dtype: torch.dtype) -> bool:
    """hyspec's batch-invariant dense kernel (dense_gemm.c) serves ``dtype`` here."""
    try:
        from hyspec.cpu_ops.dense_gemm import available
    except ImportError:
        return False
    return available(dtype)


@functools.cache
def _bf16_packing_runs() -> bool:
    """oneDNN's bf16 path needs AVX512-BW/VL/DQ or AVX-NE-CONVERT (AVX2-only CPUs such as Zen 3 lack both).

    Which instructions it needs is oneDNN's business and changes between releases, so the answer
    is one tiny pack-and-multiply rather than a flag list of our own.
    """
    if not (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")):
        return False
    try:
        weight = torch.ones(8, 8, dtype=torch.bfloat16)
        packed = torch.ops.mkldnn._reorder_linear_weight(weight, _PACK_BATCH_HINT)
        torch.ops.mkldnn._linear_pointwise(torch.ones(2, 8, dtype=torch.bfloat16), packed, None, "none", [], "")
    except RuntimeError as exc:
        log.info("bf16 weight packing unavailable on this CPU: %s", str(exc).splitlines()[0])
        return False
    return True


class PackedLinear(nn.Module):
    """Drop-in for ``nn.Linear`` at inference: same ``weight``/``bias``, packed copy for the matmul."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None):
        super().__init__()
        # the same Parameter objects when given them: what is keyed on the weight (a quantized lm_head
        # registered by the loader, hyspec.cpu_ops.quantized_linear.QUANTIZED_HEADS) still finds it
        self.weight = _frozen(weight)
        self.bias = None if bias is None else _frozen(bias)
        self.in_features, self.out_features = weight.shape[1], weight.shape[0]
        self._matmul = _packed_matmul(self.weight, self.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != self.weight.dtype or torch.is_grad_enabled() and x.requires_grad:
            return F.linear(x, self.weight, self.bias)
        rows = x.reshape(-1, self.in_features)
        if not rows.is_contiguous():
            rows = rows.contiguous()
        return self._matmul(rows).reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, dtype={self.weight.dtype}, packed"


def _frozen(t: torch.Tensor) -> nn.Parameter:
    if isinstance(t, nn.Parameter) and not t.requires_grad:
        return t
    return nn.Parameter(t.detach(), requires_grad=False)


def _packed_matmul(weight: torch.Tensor, bias: torch.Tensor | None) -> Callable[[torch.Tensor], torch.Tensor]:
    if invariant_kernel_available(weight.dtype):
        from hyspec.cpu_ops.dense_gemm import dense_gemm

        w = weight.detach().contiguous()
        b = None if bias is None else bias.detach().contiguous()
        return lambda x: dense_gemm(x, w, b)
    if weight.dtype == torch.bfloat16:
        packed = torch.ops.mkldnn._reorder_linear_weight(weight, _PACK_BATCH_HINT)
        return lambda x: torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")
    if weight.dtype == torch.float32:
        packed = torch.ops.mkl._mkl_reorder_linear_weight(weight, _PACK_BATCH_HINT)
        return lambda x: torch.ops.mkl._mkl_linear(x, packed, weight, bias, x.shape[0])
    raise TypeError(f"no packed CPU linear for {weight.dtype}")


def pack_linears(module: nn.Module) -> int:
    """Replace every ``nn.Linear`` under ``module`` (weights on the CPU, packable dtype); return how many."""
    count = 0
    for parent in list(module.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear and child.weight.device.type == "cpu" and packing_available(child.weight.dtype):
                setattr(parent, name, PackedLinear(child.weight, child.bias))
                count += 1
    return count


class PackedLogits(nn.Module):
    """``hidden -> logits`` against a (possibly tied) lm_head weight, packed like the other linears."""

    def __init__(self, weight: torch.Tensor):
        super().__init__()
        self.inner = PackedLinear(weight.detach(), None)  # an alias, never the key of PackedHeads itself

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.inner(hidden).float()


class PackedHeads:
    """One :class:`PackedLogits` per lm_head weight tensor, packed on first use.

    Keyed on the weight tensor's identity, weakly: an entry lives as long as
    the model holding the weight (the packed copy keeps only a detached alias,
    never the key itself).  An in-place change of the weight (``load_state_dict``
    into it, an optimiser step) bumps its version counter and the next call
    packs it again, so a cached copy is never stale.
    """

    def __init__(self) -> None:
        self._heads: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self._lock = threading.Lock()

    def get(self, weight: torch.Tensor) -> PackedLogits:
        version = _version(weight)
        entry = self._heads.get(weight)
        if entry is None or entry[0] != version:
            with self._lock:  # two threads packing the same weight at once would only waste the work
                entry = (version, PackedLogits(weight))
                self._heads[weight] = entry
        return entry[1]

    def __len__(self) -> int:
        return len(self._heads)


def _version(t: torch.Tensor) -> int | None:
    try:
        return t._version
    except RuntimeError:  # an inference-mode tensor has no version counter (and is not modified outside it)
        return None


#: The CPU backend's packed lm_heads (the target's, and the drafters' that share it: one copy per weight).
PACKED_HEADS = PackedHeads()


def packed_logits(hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:  # [..., H], [V, H] -> [..., V] fp32
    """The CPU backend's ``logits`` op: the matmul against a packed copy of ``weight`` (made once per weight),
    or against its quantized stand-in where the loader registered one (``quantized_linear.QUANTIZED_HEADS``).

    Falls back to the reference (``F.linear(...).float()``) where packing does
    not apply: a tensor off the CPU, mixed or unpackable dtypes, or autograd
    (training needs the gradient F.linear gives).
    """
    training = torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad)
    if not training and hidden.device.type == "cpu":
        from hyspec.cpu_ops.quantized_linear import QUANTIZED_HEADS

        quantized = QUANTIZED_HEADS.get(weight)  # the loader kept this head's codes (GGUF Q8_0, --quantization)
        if quantized is not None:
            return quantized(hidden).float()
    if (weight.device.type != "cpu" or hidden.device.type != "cpu" or hidden.dtype != weight.dtype or training
            or not packing_available(weight.dtype)):
        return F.linear(hidden, weight).float()
    return PACKED_HEADS.get(weight)(hidden)
