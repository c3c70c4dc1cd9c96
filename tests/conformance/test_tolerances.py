"""The conformance tolerance table: where each bound comes from, and how a result is measured."""
from __future__ import annotations

import pytest
import torch

from hyspec.conformance.tolerances import DTYPES, MATMUL_OPS, SOURCES, TENSOR_OPS, Bound, bound
from hyspec.cuda_ops.tolerances import TOLERANCES as CUDA
from hyspec.npu_ops.tolerances import TOLERANCES as NPU


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_kernel_sources_use_their_packages_tables_and_the_rest_the_envelope(dtype):
    for op in TENSOR_OPS:
        triton, npu, ref = bound(op, dtype, "triton"), bound(op, dtype, "torch_npu"), bound(op, dtype, "reference")
        assert (triton.atol, triton.rtol) == (CUDA[dtype][op].atol, CUDA[dtype][op].rtol)
        if op in NPU[dtype]:
            assert (npu.atol, npu.rtol) == (NPU[dtype][op].atol, NPU[dtype][op].rtol)
        else:
            assert npu.exact  # compact_kv moves bytes
        assert (ref.atol, ref.rtol) == (max(triton.atol, npu.atol), max(triton.rtol, npu.rtol))
        assert bound(op, dtype, "cpu_ops") == ref


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_the_logits_matmul_has_one_bound_whatever_serves_it(dtype):
    bounds = {source: bound("logits", dtype, source) for source in SOURCES}
    assert len({(b.atol, b.rtol) for b in bounds.values()}) == 1 and not bounds["reference"].exact
    if dtype != torch.float32:  # 2 ulp of the result, 1 ulp at 1.0
        ulp = torch.finfo(dtype).eps
        assert (bounds["cpu_ops"].atol, bounds["cpu_ops"].rtol) == (ulp, 2 * ulp)
    assert "logits" in MATMUL_OPS and "logits" not in TENSOR_OPS


def test_token_ops_are_exact_and_unknown_names_are_refused():
    assert bound("sample", torch.float32, "triton").exact and bound("rejection_sample", torch.float32, "x").exact
    with pytest.raises(KeyError, match="op"):
        bound("softmax", torch.float32, "triton")
    with pytest.raises(KeyError, match="source"):
        bound("attention", torch.float32, "tpu")
    with pytest.raises(KeyError, match="dtype"):
        bound("attention", torch.float64, "triton")


def test_measure_reports_error_and_ratio_and_never_passes_nan():
    b = Bound(atol=0.1, rtol=0.0, origin="test")
    assert b.measure(torch.tensor([1.0, 2.05]), torch.tensor([1.0, 2.0])) == pytest.approx((0.05, 0.5))
    assert b.measure(torch.tensor([float("nan")]), torch.tensor([1.0]))[1] == float("inf")
    assert Bound(0.0, 0.0, "exact").measure(torch.tensor([1.0]), torch.tensor([1.0 + 2 ** -23]))[1] == float("inf")
    assert b.measure(torch.zeros(2), torch.zeros(3)) == (float("inf"), float("inf"))
