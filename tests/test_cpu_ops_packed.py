"""Packed CPU linears: same results as F.linear, and each row independent of how many rows share the call."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from hyspec.cpu_ops.optimize import optimize_for_cpu
from hyspec.cpu_ops.packed_linear import PackedLinear, invariant_kernel_available, pack_linears, packing_available

DTYPES = [d for d in (torch.float32, torch.bfloat16) if packing_available(d)]
# fp32: MKL's packed GEMM vs F.linear's kernels differ only in summation order over K=512.
# bf16: both accumulate in fp32 and round once; the rounding of the fp32 sum can differ by 1 ulp.
TOL = {torch.float32: dict(atol=1e-4, rtol=1e-5), torch.bfloat16: dict(atol=2e-2, rtol=1e-2)}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bias", [False, True])
def test_packed_matches_linear(dtype, bias):
    torch.manual_seed(0)
    lin = nn.Linear(512, 384, bias=bias).to(dtype)
    packed = PackedLinear(lin.weight, lin.bias)
    x = torch.randn(5, 7, 512).to(dtype)
    with torch.inference_mode():
        torch.testing.assert_close(packed(x), lin(x), **TOL[dtype])


def _rows(dtype):
    torch.manual_seed(1)
    packed = PackedLinear(torch.randn(1024, 512).to(dtype) * 0.05, None)
    x = torch.randn(40, 512).to(dtype)
    magnitude = x.float().abs() @ packed.weight.float().abs().T  # [40, 1024] sum_k |x_k w_k| per output
    with torch.inference_mode():
        alone = torch.cat([packed(x[i:i + 1]) for i in range(40)])
        return [(n, packed(x[:n]), alone[:n], magnitude[:n]) for n in (2, 3, 8, 17, 40)]


@pytest.mark.parametrize("dtype", DTYPES)
def test_row_results_agree_within_one_rounding(dtype):
    """On every CPU: a row computed among n rows differs from the same row alone by at most the dtype's rounding."""
    for n, together, alone, magnitude in _rows(dtype):
        diff = (together.float() - alone.float()).abs()
        # Another summation order over K terms moves an fp32 dot product by at most 2 * gamma_K * sum|w x|
        # (gamma_K = K u / (1 - K u), u = 2**-24: the textbook worst case, no fitting); bf16 output then
        # rounds once more, by at most one bf16 ulp of the result.
        k, u = 512, 2.0 ** -24
        bound = 2 * (k * u / (1 - k * u)) * magnitude
        if dtype == torch.bfloat16:
            bound = bound + alone.float().abs() * 2.0 ** -7
        assert bool((diff <= bound).all()), (n, diff.max().item())


@pytest.mark.parametrize("dtype", DTYPES)
def test_row_results_do_not_depend_on_row_count(dtype):
    """What makes n-token verification bit-identical to n one-token steps: true by construction with
    hyspec's dense_gemm kernel, on every CPU (the same operations, in the same order, for every row)."""
    if not invariant_kernel_available(dtype):
        pytest.skip("no C compiler here: MKL / oneDNN packing, whose rows depend on the row count on some CPUs "
                    "(measured: fp32 from 5 rows on AMD Zen 5; the near-tie rule of hyspec.numerics covers it)")
    for n, together, alone, _ in _rows(dtype):
        assert torch.equal(together, alone), n


@pytest.mark.parametrize("dtype", DTYPES)
def test_row_results_do_not_depend_on_row_count_with_odd_shapes(dtype):
    """Tails: K not a multiple of the vector width, N not a multiple of the output block, bias, 1..41 rows."""
    if not invariant_kernel_available(dtype):
        pytest.skip("no C compiler here: hyspec's dense_gemm kernel is not built")
    torch.manual_seed(2)
    packed = PackedLinear(torch.randn(67, 137).to(dtype) * 0.1, torch.randn(67).to(dtype))
    x = torch.randn(41, 137).to(dtype)
    with torch.inference_mode():
        alone = torch.cat([packed(x[i:i + 1]) for i in range(41)])
        for n in (2, 3, 4, 5, 9, 41):
            assert torch.equal(packed(x[:n]), alone[:n]), n
        reference = F.linear(x.double(), packed.weight.double(), packed.bias.double())
        torch.testing.assert_close(alone.double(), reference, **TOL[dtype])


def test_mkl_packing_is_what_runs_without_the_kernel(monkeypatch):
    """HYSPEC_DENSE_GEMM=0 (or no compiler): the MKL / oneDNN packed path, still close to F.linear."""
    from hyspec.cpu_ops import dense_gemm

    monkeypatch.setattr(dense_gemm, "library", lambda: None)
    torch.manual_seed(0)
    lin = nn.Linear(64, 48)
    packed = PackedLinear(lin.weight, lin.bias)
    x = torch.randn(6, 64)
    with torch.inference_mode():
        torch.testing.assert_close(packed(x), lin(x), **TOL[torch.float32])


def test_pack_linears_keeps_interface_and_falls_back_for_training():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)).to(torch.bfloat16)
    unpacked = copy.deepcopy(model)
    ref = [m.weight.clone() for m in model if isinstance(m, nn.Linear)]
    assert pack_linears(model) == (2 if packing_available(torch.bfloat16) else 0)
    assert torch.equal(model[0].weight, ref[0])
    x = torch.randn(3, 16, dtype=torch.bfloat16, requires_grad=True)
    x_ref = x.detach().clone().requires_grad_(True)
    out, out_ref = model(x), unpacked(x_ref)  # the autograd path uses F.linear
    assert torch.equal(out, out_ref)
    out.float().sum().backward()
    out_ref.float().sum().backward()
    assert torch.equal(x.grad, x_ref.grad)  # the same computation as the unpacked model, gradient included


def test_the_cpu_backend_packs_causal_lm_logits_through_the_op_table(tmp_path):
    """CausalLM.compute_logits is the op table's ``logits``: the CPU backend's packs the (tied) lm_head."""
    from hyspec.backends.cpu import CPUBackend
    from hyspec.backends.probe import probe_cpu
    from hyspec.cpu_ops.packed_linear import PACKED_HEADS
    from hyspec.model.loader import load_model
    from tests.model.hf_fixtures import make_hf_model

    make_hf_model("qwen2", tmp_path)  # tied embeddings
    backend = CPUBackend(probe_cpu())
    model = load_model(tmp_path, dtype="float32", ops=backend.ops)
    hidden = torch.randn(3, model.config.hidden_size)
    before = F.linear(hidden, model.lm_head_weight).float()
    attributes = dict(vars(model))
    assert backend.optimize_model(model) is model
    assert optimize_for_cpu(model) is model  # idempotent
    assert {k: v for k, v in vars(model).items() if k != "_modules"} == {
        k: v for k, v in attributes.items() if k != "_modules"}  # no attribute or method patched on the model
    with torch.inference_mode():
        torch.testing.assert_close(model.compute_logits(hidden), before, **TOL[torch.float32])
    if packing_available(torch.float32):
        assert backend.ops.sources["logits"] == "cpu_ops"
        assert PACKED_HEADS.get(model.lm_head_weight) is PACKED_HEADS.get(model.embed_tokens.weight)  # tied


@pytest.mark.parametrize("dtype", DTYPES)
def test_packed_logits_packs_once_per_weight_and_repacks_after_an_in_place_change(dtype):
    from hyspec.cpu_ops.packed_linear import PACKED_HEADS, packed_logits

    torch.manual_seed(2)
    weight = nn.Parameter((torch.randn(96, 64) * 0.1).to(dtype), requires_grad=False)
    hidden = torch.randn(5, 64).to(dtype)
    with torch.inference_mode():
        out = packed_logits(hidden, weight)
        head = PACKED_HEADS.get(weight)
        assert out.dtype == torch.float32 and torch.equal(out, head(hidden))
        assert packed_logits(hidden[:2], weight).shape == (2, 96) and PACKED_HEADS.get(weight) is head
    torch.testing.assert_close(out, F.linear(hidden, weight).float(), **TOL[dtype])
    with torch.no_grad():
        weight.mul_(-1)  # e.g. load_state_dict into the same tensor: the packed copy must not go stale
    with torch.inference_mode():
        torch.testing.assert_close(packed_logits(hidden, weight), -out, **TOL[dtype])
    assert PACKED_HEADS.get(weight) is not head
    import gc
    import weakref

    size, alive = len(PACKED_HEADS), weakref.ref(weight)
    del weight, head
    gc.collect()
    assert alive() is None
    # the entry goes with its weight (other tests' dead weights may leave at the same collection: at least one)
    assert len(PACKED_HEADS) <= size - 1


def test_packed_logits_falls_back_to_the_reference_for_autograd_and_unpackable_dtypes():
    from hyspec.cpu_ops.packed_linear import PACKED_HEADS, packed_logits

    torch.manual_seed(3)
    before = len(PACKED_HEADS)
    weight = torch.randn(40, 32, requires_grad=True)  # a weight being trained: no packed copy, gradients flow
    hidden = torch.randn(4, 32, requires_grad=True)
    out = packed_logits(hidden, weight)
    assert torch.equal(out, F.linear(hidden, weight).float())
    out.sum().backward()
    assert weight.grad is not None and hidden.grad is not None
    half = torch.randn(40, 32).to(torch.float16)  # fp16: nothing to pack it for
    x = torch.randn(2, 32).to(torch.float16)
    assert torch.equal(packed_logits(x, half), F.linear(x, half).float())
    assert len(PACKED_HEADS) == before


FALLBACK_ROWS = """
import torch
from hyspec.cpu_ops.packed_linear import PackedLinear, invariant_kernel_available
assert not invariant_kernel_available(torch.float32)  # HYSPEC_DENSE_GEMM=0: MKL's packed GEMM
torch.manual_seed(1)
packed = PackedLinear(torch.randn(1024, 512) * 0.05, None)
x = torch.randn(40, 512)
with torch.inference_mode():
    alone = torch.cat([packed(x[i:i + 1]) for i in range(40)])
    together = packed(x)
bound = 2 * (512 * 2.0 ** -24 / (1 - 512 * 2.0 ** -24)) * (x.abs() @ packed.weight.abs().T)
print(bool(((together - alone).abs() <= bound).all()), torch.equal(together, alone))
"""


@pytest.mark.skipif(not packing_available(torch.float32), reason="no MKL in this torch build")
@pytest.mark.parametrize("mkl_env", [{}, {"MKL_ENABLE_INSTRUCTIONS": "AVX2"}, {"MKL_CBWR": "COMPATIBLE"},
                                     {"MKL_CBWR": "AVX2"}], ids=["default", "avx2", "cbwr-compatible", "cbwr-avx2"])
def test_the_mkl_fallback_stays_within_one_rounding_on_each_of_mkls_code_paths(mkl_env):
    """Without a C compiler the fp32 linears are MKL's packed GEMM, whose kernel MKL picks per CPU (vendor, ISA).
    MKL's documented switches force its other code paths here, so the claim the fallback makes on every CPU
    -- a row in a batch differs from the row alone by at most one summation order's rounding -- is checked
    on paths another vendor's CPU would take (bit-equality is reported, not required)."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "HYSPEC_DENSE_GEMM": "0", "TORCH_DEVICE_BACKEND_AUTOLOAD": "0", **mkl_env}
    done = subprocess.run([sys.executable, "-c", FALLBACK_ROWS], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    within, equal = done.stdout.split()
    assert within == "True", (mkl_env, done.stdout)
