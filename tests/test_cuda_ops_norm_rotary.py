"""Triton RMSNorm (+residual) and RoPE vs the reference, on CPU under TRITON_INTERPRET=1."""
from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"  # before the kernel modules import triton's jit

import pytest  # noqa: E402
import torch  # noqa: E402

pytest.importorskip("triton")

from hyspec.cuda_ops.common import KernelInputError  # noqa: E402
from hyspec.cuda_ops.norm import triton_rms_norm  # noqa: E402
from hyspec.cuda_ops.rotary import triton_rotary  # noqa: E402
from hyspec.cuda_ops.tolerances import tolerance  # noqa: E402
from hyspec.ops import reference_ops  # noqa: E402

REF = reference_ops()
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def randn(*shape: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(7, 64), (2, 5, 48), (3, 4096)], ids=["rows", "3d_odd_hidden", "wide"])
@pytest.mark.parametrize("with_residual", [False, True], ids=["plain", "residual"])
def test_rms_norm_matches_reference(dtype: torch.dtype, shape: tuple[int, ...], with_residual: bool) -> None:
    x = randn(*shape, dtype=dtype, seed=0) * 3
    weight = 1 + randn(shape[-1], dtype=dtype, seed=1) / 4
    residual = randn(*shape, dtype=dtype, seed=2) if with_residual else None
    expected = REF.rms_norm(x, weight, 1e-6, residual)
    actual = triton_rms_norm(x, weight, 1e-6, residual)
    tol = tolerance("rms_norm", dtype)
    if with_residual:
        tol.check(actual[0], expected[0], "rms_norm normed")
        # The new residual is one rounded add in the activation dtype: exact.
        tolerance("write_kv", dtype).check(actual[1], expected[1], "rms_norm new residual")
    else:
        tol.check(actual, expected, "rms_norm")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_rms_norm_fp32_weight_promotes_like_reference(dtype: torch.dtype) -> None:
    x = randn(5, 96, dtype=dtype, seed=3)
    weight = 1 + randn(96, dtype=torch.float32, seed=4) / 4
    expected = REF.rms_norm(x, weight, 1e-5)
    actual = triton_rms_norm(x, weight, 1e-5)
    assert actual.dtype == expected.dtype == torch.float32
    tolerance("rms_norm", dtype).check(actual, expected, "rms_norm fp32 weight")


def test_rms_norm_strided_rows() -> None:
    """Rows of a wider buffer (a column slice) are read through their stride."""
    buffer = randn(6, 160, dtype=torch.bfloat16, seed=5)
    x = buffer[:, 32:96]
    weight = randn(64, dtype=torch.bfloat16, seed=6)
    tolerance("rms_norm", torch.bfloat16).check(triton_rms_norm(x, weight, 1e-6), REF.rms_norm(x, weight, 1e-6))


def rope_table(max_positions: int, dim: int) -> torch.Tensor:  # [max_positions, dim] fp32
    inv_freq = 1.0 / (10000 ** (torch.arange(0, dim, 2).float() / dim))
    angles = torch.arange(max_positions).float()[:, None] * inv_freq[None, :]
    return torch.cat([angles.cos(), angles.sin()], dim=-1)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("heads", [(4, 4), (8, 2), (6, 2)], ids=["mha", "gqa4", "gqa3"])
@pytest.mark.parametrize("head_dim", [32, 48])
def test_rotary_matches_reference(dtype: torch.dtype, heads: tuple[int, int], head_dim: int) -> None:
    hq, hkv = heads
    T = 11
    q = randn(T, hq, head_dim, dtype=dtype, seed=7)
    k = randn(T, hkv, head_dim, dtype=dtype, seed=8)
    positions = torch.tensor([0, 1, 2, 5, 5, 6, 100, 101, 3, 4, 127])  # tree nodes share positions
    table = rope_table(128, head_dim)
    expected_q, expected_k = REF.rotary(q, k, positions, table)
    actual_q, actual_k = triton_rotary(q, k, positions, table)
    tolerance("rotary", dtype).check(actual_q, expected_q, "rotary q")
    tolerance("rotary", dtype).check(actual_k, expected_k, "rotary k")


def test_rotary_reads_views_of_a_fused_projection() -> None:
    qkv = randn(5, (4 + 2 + 2) * 32, dtype=torch.bfloat16, seed=9)
    q = qkv[:, :128].view(5, 4, 32)
    k = qkv[:, 128:192].view(5, 2, 32)
    positions = torch.arange(7, 12)
    table = rope_table(16, 32)
    expected = REF.rotary(q, k, positions, table)
    actual = triton_rotary(q, k, positions, table)
    for a, e in zip(actual, expected):
        tolerance("rotary", torch.bfloat16).check(a, e, "rotary on views")
    assert torch.equal(qkv[:, :128].view(5, 4, 32), q)  # inputs untouched


def test_rejects_inputs_it_cannot_serve() -> None:
    x = torch.zeros(3, 8)
    with pytest.raises(KernelInputError, match="weight"):
        triton_rms_norm(x, torch.ones(7), 1e-6)
    with pytest.raises(KernelInputError, match="residual"):
        triton_rms_norm(x, torch.ones(8), 1e-6, torch.zeros(3, 8, dtype=torch.bfloat16))
    with pytest.raises(KernelInputError, match="dtype"):
        triton_rms_norm(x.double(), torch.ones(8), 1e-6)
    q, k, table = torch.zeros(2, 4, 32), torch.zeros(2, 2, 32), rope_table(8, 32)
    with pytest.raises(KernelInputError, match="even"):
        triton_rotary(torch.zeros(2, 4, 31), torch.zeros(2, 2, 31), torch.arange(2), table[:, :31])
    with pytest.raises(KernelInputError, match="cos_sin_cache"):
        triton_rotary(q, k, torch.arange(2), table.double())
    with pytest.raises(KernelInputError, match="positions"):
        triton_rotary(q, k, torch.arange(3), table)
    with pytest.raises(KernelInputError, match="differs"):
        triton_rotary(q, k.bfloat16(), torch.arange(2), table)
