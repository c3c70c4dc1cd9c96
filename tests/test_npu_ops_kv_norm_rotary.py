"""NPU KV write, RMSNorm and RoPE wrappers vs the references, through an emulated torch_npu, on CPU."""
from __future__ import annotations

import sys

import pytest
import torch

from hyspec.npu_ops.emulation import fake_torch_npu
from hyspec.npu_ops.kv import NpuWriteKV
from hyspec.npu_ops.norm import NpuRmsNorm
from hyspec.npu_ops.rotary import NpuRotary, release_atb_rope_table
from hyspec.npu_ops.tolerances import tolerance
from hyspec.ops import reference_ops

REF = reference_ops()
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


@pytest.fixture
def npu(monkeypatch):
    module = fake_torch_npu()
    monkeypatch.setitem(sys.modules, "torch_npu", module)
    release_atb_rope_table()
    yield module
    release_atb_rope_table()


def names(module) -> list[str]:
    return [c[0] for c in module.calls]


# --- write_kv ------------------------------------------------------------------------------------------------

def pool_views(dtype: torch.dtype, layer: int = 1):
    pool = torch.randn(6, 2, 2, 16, 2, 8).to(dtype)  # [pages, layers, K/V, block_size, Hkv, D]
    return pool, pool[:, layer, 0], pool[:, layer, 1]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("which", ["scatter", "reshape_and_cache"])
def test_write_kv_matches_reference_on_the_strided_pool(npu, dtype: torch.dtype, which: str) -> None:
    torch.manual_seed(1)
    k, v = torch.randn(7, 2, 8), torch.randn(7, 2, 8)  # fp32 activations into a `dtype` cache: the op casts
    slots = torch.tensor([5 * 16 + 15, 0, 16, 17, 3 * 16 + 2, 2 * 16 + 9, 79])  # crosses pages, both block ends
    pool, k_cache, v_cache = pool_views(dtype)
    expected = pool.clone()
    REF.write_kv(k, v, expected[:, 1, 0], expected[:, 1, 1], slots)
    op = (NpuWriteKV(npu.npu_scatter_pa_kv_cache) if which == "scatter"
          else NpuWriteKV(None, npu._npu_reshape_and_cache))
    op(k, v, k_cache, v_cache, slots)
    if which == "reshape_and_cache" and dtype == torch.float32:
        assert names(npu) == []  # ATB ReshapeAndCache has no fp32 kernel: the reference wrote
    else:
        assert names(npu) == ["npu_scatter_pa_kv_cache" if which == "scatter" else "_npu_reshape_and_cache"]
    tolerance("write_kv", dtype).check(pool, expected, f"write_kv {which}")


def test_scatter_gets_nd_cache_mode_and_virtual_slots(npu) -> None:
    pool, k_cache, v_cache = pool_views(torch.bfloat16)
    NpuWriteKV(npu.npu_scatter_pa_kv_cache)(torch.randn(2, 2, 8), torch.randn(2, 2, 8), k_cache, v_cache,
                                             torch.tensor([16 + 1, 3]))
    (_, (key, value, key_cache, value_cache, slots), kwargs) = npu.calls[0]
    assert kwargs == {"cache_mode": "Norm"}
    assert key.dtype == torch.bfloat16 and key.is_contiguous() and key_cache.is_contiguous()
    assert slots.tolist() == [4 * 16 + 1, 3]  # page 1 is virtual block 4 (2 layers x K, V per page)


# --- rms_norm ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(5, 64), (3, 4, 32)], ids=["hidden", "per_head"])
def test_rms_norm_matches_reference(npu, dtype: torch.dtype, shape: tuple[int, ...]) -> None:
    torch.manual_seed(2)
    x, residual = torch.randn(shape).to(dtype), torch.randn(shape).to(dtype)
    weight = (1 + 0.1 * torch.randn(shape[-1])).to(dtype)
    op = NpuRmsNorm(npu.npu_rms_norm, npu.npu_add_rms_norm)
    tol = tolerance("rms_norm", dtype)
    tol.check(op(x, weight, 1e-6), REF.rms_norm(x, weight, 1e-6), "rms_norm")
    normed, summed = op(x, weight, 1e-6, residual)
    ref_normed, ref_summed = REF.rms_norm(x, weight, 1e-6, residual)
    tol.check(normed, ref_normed, "rms_norm + residual")
    assert torch.equal(summed, ref_summed)  # the new residual stream is the same add
    assert names(npu) == ["npu_rms_norm", "npu_add_rms_norm"]


def test_rms_norm_fallbacks(npu) -> None:
    x, residual = torch.randn(3, 16, dtype=torch.bfloat16), torch.randn(3, 16, dtype=torch.bfloat16)
    w32 = torch.ones(16)
    out = NpuRmsNorm(npu.npu_rms_norm, npu.npu_add_rms_norm)(x, w32, 1e-6)
    assert names(npu) == [] and out.dtype == REF.rms_norm(x, w32, 1e-6).dtype  # fp32 weight: reference contract
    w = torch.ones(16, dtype=torch.bfloat16)
    normed, summed = NpuRmsNorm(npu.npu_rms_norm, None)(x, w, 1e-6, residual)
    assert names(npu) == ["npu_rms_norm"] and torch.equal(summed, x + residual)
    npu.calls.clear()
    NpuRmsNorm(None, npu.npu_add_rms_norm)(x, w, 1e-6)
    assert names(npu) == []  # no npu_rms_norm: the residual-free call runs the reference


# --- rotary --------------------------------------------------------------------------------------------------

def rope_case(head_dim: int, dtype: torch.dtype, theta: float = 10000.0, seed: int = 3):
    gen = torch.Generator().manual_seed(seed)
    inv = 1.0 / theta ** (torch.arange(0, head_dim, 2).float() / head_dim)
    freqs = torch.outer(torch.arange(64).float(), inv)
    table = torch.cat([freqs.cos(), freqs.sin()], dim=-1)  # [64, D]: cos half, sin half
    q = torch.randn(6, 4, head_dim, generator=gen).to(dtype)
    k = torch.randn(6, 2, head_dim, generator=gen).to(dtype)
    positions = torch.tensor([0, 1, 2, 7, 7, 63])  # repeated positions, as tree nodes at one depth have
    return q, k, positions, table


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("head_dim, expected_op", [(64, "npu_apply_rotary_pos_emb"), (128, "npu_apply_rotary_pos_emb"),
                                                   (32, "_npu_rotary_embedding")])
def test_rotary_matches_reference(npu, dtype: torch.dtype, head_dim: int, expected_op: str) -> None:
    q, k, positions, table = rope_case(head_dim, dtype)
    q_in, k_in = q.clone(), k.clone()
    q_out, k_out = NpuRotary(npu.npu_apply_rotary_pos_emb, npu._npu_rotary_embedding)(q, k, positions, table)
    q_ref, k_ref = REF.rotary(q, k, positions, table)
    tol = tolerance("rotary", dtype)
    tol.check(q_out, q_ref, "rotary q")
    tol.check(k_out, k_ref, "rotary k")
    assert torch.equal(q, q_in) and torch.equal(k, k_in)  # the in-place kernels worked on private copies
    assert names(npu) == [expected_op]


def test_a_second_rope_table_never_reaches_atb_rope(npu) -> None:
    """ATB's _npu_rotary_embedding keeps the first table it sees for the whole process (RopeAtb.cpp statics)."""
    op = NpuRotary(None, npu._npu_rotary_embedding)
    q, k, positions, target_table = rope_case(32, torch.float32)
    _, _, _, draft_table = rope_case(32, torch.float32, theta=500000.0)
    op(q, k, positions, target_table)
    q_out, _ = op(q, k, positions, draft_table)
    tolerance("rotary", torch.float32).check(q_out, REF.rotary(q, k, positions, draft_table)[0], "second table")
    assert names(npu) == ["_npu_rotary_embedding"]  # the second table ran the reference
    stale = q.clone().view(6, -1)
    npu._npu_rotary_embedding(positions, stale, k.clone().view(6, -1), 32, draft_table, True)
    assert not torch.allclose(stale.view_as(q), q_out)  # what ATB would have done: rotate by the first table


def test_rotary_without_usable_kernels_runs_the_reference(npu) -> None:
    q, k, positions, table = rope_case(32, torch.bfloat16)
    q_out, k_out = NpuRotary(npu.npu_apply_rotary_pos_emb, None)(q, k, positions, table)  # D=32: not 64/128
    assert names(npu) == [] and torch.equal(q_out, REF.rotary(q, k, positions, table)[0])
