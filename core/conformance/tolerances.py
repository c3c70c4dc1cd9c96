"""The one tolerance table of the conformance suite: how far a backend's op may be from the reference.

A tensor result passes when ``|backend - reference| <= atol + rtol * |reference|``
elementwise; the reference op runs on the CPU on copies of the same inputs.
Token results (``sample``, ``rejection_sample``) must be equal.

The bound depends on the op, the dtype and *which implementation* serves the
op (the op table's source), because kernels round in different places:

``triton`` (hyspec.cuda_ops) and ``torch_npu`` (hyspec.npu_ops)
    Taken verbatim from the kernel packages' own tables
    (``hyspec.cuda_ops.tolerances``, ``hyspec.npu_ops.tolerances``), where each
    number is derived next to the kernel it bounds; the kernel unit tests and
    this suite therefore hold a kernel to the same bound.  In short: KV moves
    are exact; Triton RoPE is exact in bf16/fp16 (products of two half-precision
    numbers are exact in fp32) while the fused NPU RoPE rounds once where the
    reference rounds three times (4 ulp of max |q| absolute); RMSNorm 2 ulp;
    attention 2 ulp of the output plus 1 ulp at 1.0 absolute (fp32 accumulation
    in another order, P possibly rounded before P.V).

``reference`` (the reference op running on another device) and ``cpu_ops``
    The envelope -- the larger atol and the larger rtol -- of the two kernel
    tables.  On an accelerator the reference op calls the vendor's matmul and
    SDPA kernels, which may round like either kind of kernel; a CPU fast path
    may fuse like either.  On the CPU itself the reference compared with itself
    is exact, and the report shows the measured error (0), not just the bound.

Ops a kernel table does not list (``compact_kv`` on the NPU table) move bytes:
exact.

``logits`` (the lm-head matmul, fp32 out) has one bound for every source: no
kernel package serves it, but the reference itself runs the device's matmul
(cuBLAS, the NPU's) and the CPU backend's version multiplies against a packed
copy (MKL / oneDNN); all accumulate in fp32, in different orders.  fp32: the
sums then differ by a few ulp of ``sum |w x|`` (measured up to 5 u of it on
MKL vs ``F.linear``, i.e. 3e-6 for the case's hidden size 256 where
``sum |w x|`` stays below ~12): 2e-5 absolute and relative.  bf16 / fp16: the
fp32 sum is rounded once to the activation dtype, so two versions may land one
ulp apart, two with a split-K reduction rounded in the dtype: 2 ulp of the
result, plus 1 ulp at 1.0 absolute for results near zero (as for attention).  Sampling ops are exact: both sides get the same injected uniforms and
must return the same ids.  (A backend that computed its CDF in lower precision
than float64 could flip a token only when a uniform lands within its rounding
of a CDF step -- probability ~1e-7 per draw, i.e. never over this suite's few
hundred draws; such a flip would be reported, not excused.)
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from hyspec.cuda_ops import tolerances as cuda_table
from hyspec.npu_ops import tolerances as npu_table

TENSOR_OPS = ("attention", "write_kv", "compact_kv", "rms_norm", "rotary")
MATMUL_OPS = ("logits",)
TOKEN_OPS = ("sample", "rejection_sample")
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
SOURCES = ("reference", "cpu_ops", "triton", "torch_npu")


@dataclass(frozen=True)
class Bound:
    atol: float
    rtol: float
    origin: str  # which table the numbers come from (printed in the report)

    def __post_init__(self) -> None:
        if self.atol < 0 or self.rtol < 0:
            raise ValueError(f"Bound: atol {self.atol} and rtol {self.rtol} must be >= 0")

    @property
    def exact(self) -> bool:
        return self.atol == 0 and self.rtol == 0

    def measure(self, actual: torch.Tensor, expected: torch.Tensor) -> tuple[float, float]:
        """(max |actual - expected|, worst ratio to the bound): ratio <= 1 passes; NaN anywhere -> inf."""
        a, e = actual.detach().cpu().double(), expected.detach().cpu().double()
        if a.shape != e.shape:
            return float("inf"), float("inf")
        inf = float("inf")
        diff = (a - e).abs().nan_to_num(nan=inf, posinf=inf)
        if diff.numel() == 0:
            return 0.0, 0.0
        bound = self.atol + self.rtol * e.abs()
        ratio = torch.where(diff == 0, torch.zeros_like(diff), diff / bound)
        return float(diff.max()), float(ratio.nan_to_num(nan=inf, posinf=inf).max())

    def describe(self) -> str:
        return "exact" if self.exact else f"atol {self.atol:.3g}, rtol {self.rtol:.3g}"



def _kernel_bound(table: dict, name: str, op: str, dtype: torch.dtype) -> Bound:
    tol = table.get(dtype, {}).get(op)
    if tol is None:  # an op the kernel package does not serve (compact_kv on the NPU) moves bytes
        return Bound(0.0, 0.0, f"{name}: op not in its table, bytes moved: exact")
    return Bound(tol.atol, tol.rtol, name)


#: ``logits``, whatever serves it: fp32 summation order; bf16/fp16 2 ulp + 1 ulp at 1.0 (module doc).
MATMUL_BOUNDS = {torch.float32: (2e-5, 2e-5), torch.bfloat16: (2.0 ** -7, 2.0 ** -6),
                 torch.float16: (2.0 ** -10, 2.0 ** -9)}


def bound(op: str, dtype: torch.dtype, source: str) -> Bound:
    """The tolerance for ``op`` in ``dtype`` when the op table's ``source`` serves it (see the module doc)."""
    if op in TOKEN_OPS:
        return Bound(0.0, 0.0, "token ids: exact")
    if op not in TENSOR_OPS + MATMUL_OPS:
        raise KeyError(f"no conformance tolerance for op {op!r}; ops are {TENSOR_OPS + MATMUL_OPS + TOKEN_OPS}")
    if dtype not in DTYPES:
        raise KeyError(f"no conformance tolerance for dtype {dtype}; dtypes are {[str(d) for d in DTYPES]}")
    if source not in SOURCES:
        raise KeyError(f"no conformance tolerance for op source {source!r}; sources are {SOURCES}")
    if op in MATMUL_OPS:
        atol, rtol = MATMUL_BOUNDS[dtype]
        return Bound(atol, rtol, "matmul: fp32 accumulation in another order, one rounding to the dtype")
    if source == "triton":
        return _kernel_bound(cuda_table.TOLERANCES, "hyspec.cuda_ops.tolerances", op, dtype)
    if source == "torch_npu":
        return _kernel_bound(npu_table.TOLERANCES, "hyspec.npu_ops.tolerances", op, dtype)
    cuda = _kernel_bound(cuda_table.TOLERANCES, "cuda", op, dtype)
    npu = _kernel_bound(npu_table.TOLERANCES, "npu", op, dtype)
    return Bound(max(cuda.atol, npu.atol), max(cuda.rtol, npu.rtol), "envelope of the cuda_ops and npu_ops tables")


def markdown_table() -> str:
    """The table as docs/conformance.md prints it (``atol / rtol``; one row per op and dtype)."""
    def cell(b: Bound) -> str:
        return "exact" if b.exact else f"{b.atol:.3g} / {b.rtol:.3g}"

    lines = ["| op | dtype | triton | torch_npu | reference, cpu_ops |", "|---|---|---|---|---|"]
    for op in TENSOR_OPS + MATMUL_OPS:
        for dtype in DTYPES:
            cells = [cell(bound(op, dtype, source)) for source in ("triton", "torch_npu", "reference")]
            lines.append(f"| {op} | {str(dtype).removeprefix('torch.')} | " + " | ".join(cells) + " |")
    lines.append("| sample, rejection_sample | float32 | exact | exact | exact |")
    return "\n".join(lines)


__all__ = ["Bound", "DTYPES", "MATMUL_OPS", "SOURCES", "TENSOR_OPS", "TOKEN_OPS", "bound", "markdown_table"]
