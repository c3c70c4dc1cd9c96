"""How far an NPU op may differ from its reference: one table per dtype.

A result passes when ``|npu - reference| <= atol + rtol * |reference|``
elementwise.  The fused kernels compute in fp32 and round once at the end;
the references round after each torch op.  Why these values:

* ``write_kv`` moves bytes (a dtype change rounds like ``Tensor.to``): exact.
* ``rotary``: the reference rounds ``q*cos``, ``rotate(q)*sin`` and their
  sum separately in bf16/fp16 (three roundings); a fused kernel rounds the
  exact fp32 result once.  The two extra roundings are half an ulp of terms
  bounded by ``max |q|``, not of the (possibly cancelling) result, so the
  bound is absolute: for activations ``|q| < 8`` at most 1 ulp at 4
  (``atol``), plus 1 ulp of the result (``rtol``) for the final rounding.
  Measured against the emulation on 200 random cases (q ~ N(0, 1),
  D = 128, positions < 4096): at most half this bound.  fp32: a few ulps.
* ``rms_norm``: the reference rounds ``x * rstd`` to the dtype and then
  ``weight * h`` again; the kernel rounds ``x * rstd * weight`` once: up to
  2 ulp of the result.  fp32: the sum of squares runs in another order.
* ``attention``: both accumulate in fp32 in different orders (tiles, online
  softmax) and the reference's SDPA may round P to the dtype before P.V:
  2 ulp of the output, ``atol`` 1 ulp at 1.0 for outputs near zero.

These tolerances describe rounding only; the conformance suite applies the
same table to the real kernels on an Ascend machine.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Tolerance:
    atol: float
    rtol: float

    def __post_init__(self) -> None:
        if self.atol < 0 or self.rtol < 0:
            raise ValueError(f"Tolerance: atol {self.atol} and rtol {self.rtol} must be >= 0")

    def check(self, actual: torch.Tensor, expected: torch.Tensor, what: str = "") -> None:
        """Raise AssertionError naming the worst element when ``actual`` is out of tolerance."""
        if actual.shape != expected.shape or actual.dtype != expected.dtype:
            raise AssertionError(f"{what}: got {actual.dtype} {tuple(actual.shape)}, expected "
                                 f"{expected.dtype} {tuple(expected.shape)}")
        a, e = actual.double(), expected.double()
        diff = (a - e).abs().nan_to_num(nan=float("inf"))
        excess = diff - (self.atol + self.rtol * e.abs())
        if excess.numel() and float(excess.max()) > 0:
            worst = int(excess.flatten().argmax())
            raise AssertionError(f"{what}: out of tolerance (atol={self.atol:g}, rtol={self.rtol:g}) at flat index "
                                 f"{worst}: {a.flatten()[worst].item()!r} vs {e.flatten()[worst].item()!r}")


EXACT = Tolerance(0.0, 0.0)
_BF16_ULP = 2.0 ** -7  # spacing of bf16 numbers in [1, 2)
_FP16_ULP = 2.0 ** -10
_FP32_ULP = 2.0 ** -23

TOLERANCES: dict[torch.dtype, dict[str, Tolerance]] = {
    torch.float32: {
        "attention": Tolerance(atol=1e-5, rtol=1e-5),
        "rms_norm": Tolerance(atol=1e-6, rtol=1e-5),
        "rotary": Tolerance(atol=4 * _FP32_ULP, rtol=4 * _FP32_ULP),
        "write_kv": EXACT,
    },
    torch.bfloat16: {
        "attention": Tolerance(atol=_BF16_ULP, rtol=2 * _BF16_ULP),
        "rms_norm": Tolerance(atol=1e-6, rtol=2 * _BF16_ULP),
        "rotary": Tolerance(atol=4 * _BF16_ULP, rtol=_BF16_ULP),
        "write_kv": EXACT,
    },
    torch.float16: {
        "attention": Tolerance(atol=_FP16_ULP, rtol=2 * _FP16_ULP),
        "rms_norm": Tolerance(atol=1e-6, rtol=2 * _FP16_ULP),
        "rotary": Tolerance(atol=4 * _FP16_ULP, rtol=_FP16_ULP),
        "write_kv": EXACT,
    },
}


def tolerance(op: str, dtype: torch.dtype) -> Tolerance:
    try:
        return TOLERANCES[dtype][op]
    except KeyError:
        raise KeyError(f"no NPU tolerance for op {op!r} in {dtype}") from None
