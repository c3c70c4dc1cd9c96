"""hyspec's dense CPU kernel (cpu_ops/dense_gemm.c) and the batch-invariant attention kernel, on every ISA path.

CI runs on one CPU at a time (AMD or Intel, AVX-512 or AVX2 only); the kernels' AVX2 and portable
paths are what another machine would run, so each is built here for every ``-march`` this CPU can
execute and checked for the property the kernels exist for: a row's result does not depend on how
many rows share the call, and matches a float64 computation within its dtype's rounding.
"""
from __future__ import annotations

import platform

import pytest
import torch

from hyspec.cpu_ops import dense_gemm as dg
from hyspec.cpu_ops import paged_attention as pa
from hyspec.cpu_ops.native import _cpu_key


def _marches() -> list[str]:
    if platform.machine() not in ("x86_64", "AMD64"):
        return ["native"]
    flags = set(_cpu_key().split())
    out = ["x86-64"]  # the portable path: no vector ISA assumed
    if {"avx2", "fma", "f16c"} <= flags:
        out.append("haswell")  # AVX2 + FMA: what an AVX2-only CPU (AMD Zen 3) runs
    out.append("native")  # this CPU's own (AVX-512 with or without AVX512_BF16 where present)
    return out


MARCHES = _marches()
ISA = {"x86-64": "portable", "haswell": "avx2+fma"}


def _lib(march):
    lib = dg.variant(march)
    if lib is None:
        pytest.skip("no C compiler here")
    return lib


@pytest.mark.parametrize("march", MARCHES)
def test_each_isa_path_builds_and_says_which_it_is(march):
    lib = _lib(march)
    if march in ISA:
        assert dg.isa(lib) == ISA[march]
    else:
        assert dg.isa(lib) in ("portable", "avx2+fma", "avx512f", "avx512f+avx512_bf16")


@pytest.mark.parametrize("march", MARCHES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(67, 137), (64, 64), (33, 576)], ids=["odd", "even", "wide"])
def test_rows_do_not_depend_on_the_row_count(march, dtype, shape):
    lib = _lib(march)
    n, k = shape
    torch.manual_seed(n + k)
    w = (torch.randn(n, k) * 0.1).to(dtype)
    b = torch.randn(n).to(dtype)
    x = torch.randn(41, k).to(dtype)
    alone = torch.cat([dg.dense_gemm(x[i:i + 1].contiguous(), w, b, lib=lib) for i in range(41)])
    for m in (2, 3, 4, 5, 7, 8, 9, 17, 41):
        assert torch.equal(dg.dense_gemm(x[:m].contiguous(), w, b, lib=lib), alone[:m]), m
    exact = x.double() @ w.double().T + b.double()
    # fp32: another summation order than float64's; bf16: one rounding of the fp32 result (plus the
    # pairwise products of vdpbf16ps where it is used)
    magnitude = x.double().abs() @ w.double().abs().T + b.double().abs()
    if dtype == torch.float32:
        assert bool(((alone.double() - exact).abs() <= 2 * k * 2.0 ** -24 * magnitude).all())
    else:
        assert bool(((alone.double() - exact).abs() <= 2.0 ** -8 * exact.abs() + 2 * k * 2.0 ** -24 * magnitude
                     + 1e-30).all())


def test_isa_paths_agree_within_rounding():
    """The paths differ only in summation order (per machine, never per batch): close, not equal."""
    torch.manual_seed(0)
    w, x = torch.randn(48, 300) * 0.1, torch.randn(5, 300)
    outs = [dg.dense_gemm(x, w, lib=_lib(m)) for m in MARCHES]
    for out in outs[1:]:
        torch.testing.assert_close(out, outs[0], atol=1e-5, rtol=1e-5)


def test_bad_arguments_are_refused_by_name():
    lib = _lib("native")
    with pytest.raises(ValueError, match="do not multiply"):
        dg.dense_gemm(torch.randn(2, 8), torch.randn(4, 9), lib=lib)
    with pytest.raises(ValueError, match="one dtype"):
        dg.dense_gemm(torch.randn(2, 8), torch.randn(4, 8).bfloat16(), lib=lib)
    with pytest.raises(ValueError, match="contiguous"):
        dg.dense_gemm(torch.randn(8, 2).T, torch.randn(4, 8), lib=lib)
    with pytest.raises(ValueError, match="bias of shape"):
        dg.dense_gemm(torch.randn(2, 8), torch.randn(4, 8), torch.randn(5), lib=lib)
    assert dg.dense_gemm(torch.randn(0, 8), torch.randn(4, 8), lib=lib).shape == (0, 4)


@pytest.mark.parametrize("march", MARCHES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_attention_rows_are_the_same_in_decode_and_verification_on_every_path(march, dtype):
    from tests.test_cpu_ops_attention import _meta

    lib = pa.variant(march)
    if lib is None:
        pytest.skip("no C compiler here")
    torch.manual_seed(1)
    k_cache, v_cache = torch.randn(16, 16, 3, 64).to(dtype), torch.randn(16, 16, 3, 64).to(dtype)
    table = torch.randperm(16)[:8].to(torch.int32)[None]
    q = torch.randn(5, 9, 64).to(dtype)
    verify = pa.paged_attention(q, k_cache, v_cache, _meta(table, 5, 100), 0.125, lib=lib)
    for i in range(5):
        decode = pa.paged_attention(q[i:i + 1].contiguous(), k_cache, v_cache, _meta(table, 1, 96 + i), 0.125,
                                    lib=lib)
        assert torch.equal(decode, verify[i:i + 1]), i
