"""hyspec.numerics: the near-tie tolerance that excuses (and reports) an argmax flip."""
from __future__ import annotations

import pytest
import torch

from hyspec.numerics import (
    NEAR_TIE_TOLERANCE,
    classify_divergence,
    first_divergence,
    is_near_tie,
    tolerance_for,
    top2_gap,
)


def test_table_covers_the_compute_dtypes():
    assert set(NEAR_TIE_TOLERANCE) == {torch.float32, torch.bfloat16, torch.float16}
    bounds = [tolerance_for(d).bound(10.0) for d in (torch.float32, torch.float16, torch.bfloat16)]
    assert bounds == sorted(bounds)  # coarser dtypes tolerate more
    with pytest.raises(ValueError, match="no near-tie tolerance for dtype torch.float64"):
        tolerance_for(torch.float64)


def test_is_near_tie():
    row = torch.tensor([10.0, 10.0 - 5e-5, 3.0])
    assert is_near_tie(row, torch.float32)
    assert not is_near_tie(torch.tensor([10.0, 9.9, 3.0]), torch.float32)
    assert is_near_tie(torch.tensor([10.0, 9.9, 3.0]), torch.bfloat16)  # bound 0.17 at |10|
    assert not is_near_tie(torch.tensor([10.0, 9.5, 3.0]), torch.bfloat16)
    assert top2_gap(torch.tensor([1.0, float("nan"), 0.5])) == (1.0, 0.5)
    assert not is_near_tie(torch.tensor([2.0]), torch.float32)


def test_classify_divergence():
    logits = torch.tensor([0.0, 8.0, 8.0 - 1e-5, 1.0])
    assert classify_divergence([1, 2, 3], [1, 2, 3], None, torch.float32).kind == "identical"
    tie = classify_divergence([5, 1, 0], [5, 2, 9], logits, torch.float32)
    assert tie.kind == "near_tie" and tie.allowed and tie.index == 1
    assert "near_tie at position 1: expected token 1, got 2" in tie.describe()
    bug = classify_divergence([5, 1], [5, 3], logits, torch.float32)
    assert bug.kind == "mismatch" and not bug.allowed
    assert classify_divergence([5, 1], [5, 1, 2], logits, torch.float32).kind == "mismatch"  # ran longer
    poisoned = torch.tensor([0.0, 8.0, float("nan"), 1.0])
    assert classify_divergence([1], [2], poisoned, torch.float32).kind == "mismatch"
    with pytest.raises(ValueError, match="needs the reference logits"):
        classify_divergence([1], [2], None, torch.float32)
    assert first_divergence([1, 2], [1, 2]) is None and first_divergence([1], [1, 2]) == 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_tolerance_covers_measured_reduction_order_differences(dtype):
    """One lm_head computed batched, one row at a time, and with a split reduction: every
    logit difference stays inside the near-tie bound.  Measured on this CPU (ratio to the
    bound): fp32 0.09, bf16 0.48 (one ulp at |logit| ~ 38), fp16 0.16 -- one layer uses at
    most half the budget; the rest is for differences carried in from earlier layers."""
    g = torch.Generator().manual_seed(0)
    hidden, vocab, rows = 512, 2000, 64
    h = (torch.randn(rows, hidden, generator=g)).to(dtype)
    w = (torch.randn(hidden, vocab, generator=g) / hidden**0.5 * 8).to(dtype)
    batched = (h @ w).double()
    one_by_one = torch.cat([(h[i : i + 1] @ w) for i in range(rows)]).double()
    half = hidden // 2
    split = ((h[:, :half] @ w[:half]) + (h[:, half:] @ w[half:])).double()  # another accumulation order
    tol = tolerance_for(dtype)
    bound = tol.absolute + tol.relative * batched.abs().amax(dim=1, keepdim=True)
    for other in (one_by_one, split):
        ratio = float(((batched - other).abs() / bound).max())
        assert ratio <= 1.0, f"{dtype}: rounding difference is {ratio:.2f} x the near-tie bound"
