"""How far each Triton op may differ from its reference: one table per dtype.

A result passes when ``|kernel - reference| <= atol + rtol * |reference|``
elementwise.  Why these values:

* ``write_kv`` / ``compact_kv`` move bytes (a dtype change rounds to nearest
  even exactly like ``Tensor.to``), so they must be bit-identical.
* ``rotary`` rounds each product and the sum where the reference's separate
  torch ops round; products of two bf16/fp16 numbers are exact in fp32, so the
  half-precision results are bit-identical.  In fp32 the launches switch FMA
  contraction off (``enable_fp_fusion=False``), so products and sums round
  per op as the reference's do; the few-ulp fp32 tolerance is headroom for
  a compiler that reassociates anyway.
* ``rms_norm`` rounds where the reference rounds; only the fp32 sum of
  squares runs in another order (relative error ~1e-7 for hidden sizes up to
  16k), which can flip the rounding of ``h`` and then of ``weight * h`` by one
  ulp each: 2 ulp of the dtype (bf16 ulp = 2^-7 relative, fp16 2^-10).  fp32
  keeps ~100 ulp of headroom for the reordered sum.
* ``attention`` accumulates in fp32 in both versions but in another order
  (tiles, online softmax, split-KV merge), and the reference's SDPA may round
  P to the activation dtype before P.V.  Both land within ~1 ulp of the exact
  (fp64) result after the final rounding to the activation dtype, so they may
  differ by 2 ulp of the output; ``atol`` (1 ulp at 1.0) covers outputs near
  zero, whose error is set by the larger values averaged into them.  fp32
  outputs are averages over up to ~10^4 keys summed in another order with
  ``exp2`` instead of ``exp``: 1e-5.
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

    def excess(self, actual: torch.Tensor, expected: torch.Tensor) -> float:
        """max(|a - e| / (atol + rtol |e|)): <= 1 passes (inf where an exact op differs, nan -> inf)."""
        a, e = actual.double(), expected.double()
        diff = (a - e).abs()
        bound = self.atol + self.rtol * e.abs()
        ratio = torch.where(diff == 0, torch.zeros_like(diff), diff / bound)
        ratio = torch.nan_to_num(ratio, nan=float("inf"))
        return float(ratio.max()) if ratio.numel() else 0.0

    def check(self, actual: torch.Tensor, expected: torch.Tensor, what: str = "") -> None:
        """Raise AssertionError naming the worst element when ``actual`` is out of tolerance."""
        if actual.shape != expected.shape or actual.dtype != expected.dtype:
            raise AssertionError(f"{what}: got {actual.dtype} {tuple(actual.shape)}, expected "
                                 f"{expected.dtype} {tuple(expected.shape)}")
        excess = self.excess(actual, expected)
        if excess > 1.0:
            diff = (actual.double() - expected.double()).abs().nan_to_num(nan=float("inf"))
            worst = int(diff.flatten().argmax())
            raise AssertionError(
                f"{what}: {excess:.3g}x over tolerance (atol={self.atol:g}, rtol={self.rtol:g}); worst at flat "
                f"index {worst}: {actual.flatten()[worst].item()!r} vs {expected.flatten()[worst].item()!r}")


EXACT = Tolerance(0.0, 0.0)
_BF16_ULP = 2.0 ** -7  # spacing of bf16 numbers in [1, 2)
_FP16_ULP = 2.0 ** -10

TOLERANCES: dict[torch.dtype, dict[str, Tolerance]] = {
    torch.float32: {
        "attention": Tolerance(atol=1e-5, rtol=1e-5),
        "rms_norm": Tolerance(atol=1e-6, rtol=1e-5),
        "rotary": Tolerance(atol=1e-6, rtol=1e-6),
        "write_kv": EXACT,
        "compact_kv": EXACT,
    },
    torch.bfloat16: {
        "attention": Tolerance(atol=_BF16_ULP, rtol=2 * _BF16_ULP),
        "rms_norm": Tolerance(atol=1e-6, rtol=2 * _BF16_ULP),
        "rotary": EXACT,
        "write_kv": EXACT,
        "compact_kv": EXACT,
    },
    torch.float16: {
        "attention": Tolerance(atol=_FP16_ULP, rtol=2 * _FP16_ULP),
        "rms_norm": Tolerance(atol=1e-6, rtol=2 * _FP16_ULP),
        "rotary": EXACT,
        "write_kv": EXACT,
        "compact_kv": EXACT,
    },
}


def tolerance(op: str, dtype: torch.dtype) -> Tolerance:
    try:
        return TOLERANCES[dtype][op]
    except KeyError:
        raise KeyError(f"no tolerance for op {op!r} in {dtype}; table has {sorted(map(str, TOLERANCES))} x "
                       f"{sorted(TOLERANCES[torch.float32])}") from None
