"""The CPU backend's paged attention (cpu_ops/paged_attention.c) against the reference op, and the property it
exists for: a query row's output is the same in a decode step and inside a verification batch."""
from __future__ import annotations

import pytest
import torch

from hyspec.cpu_ops.paged_attention import library, paged_attention
from hyspec.cuda_ops.cases import paged_attention_case
from hyspec.ops import reference_ops
from hyspec.ops.attention import AttentionMetadata

REF = reference_ops()
needs_kernel = pytest.mark.skipif(library() is None, reason="no C compiler here: the attention kernel cannot build")

SCENARIOS = {  # (context_lens, query_lens, block_size, tree)
    "decode": ([70, 40, 5], [1, 1, 1], 16, False),
    "prefill": ([0, 13], [33, 20], 16, False),
    "ragged": ([0, 30, 7, 64], [9, 1, 4, 2], 32, False),
    "tree": ([20, 70, 0], [8, 1, 13], 16, True),
}


@needs_kernel
@pytest.mark.parametrize("scenario", SCENARIOS)
@pytest.mark.parametrize("heads", [(4, 4), (9, 3)], ids=["mha", "gqa3"])
def test_matches_the_reference(scenario, heads):
    ctx, qlens, block_size, tree = SCENARIOS[scenario]
    case = paged_attention_case(ctx, qlens, *heads, 64, block_size, torch.float32, tree=tree, seed=len(scenario))
    expected = REF.attention(*case.args())
    actual = paged_attention(*case.args())
    # fp32, another summation order than SDPA's: a few ulps of the output's scale
    torch.testing.assert_close(actual, expected, atol=2e-6, rtol=1e-5)


def _meta(table: torch.Tensor, qlen: int, seq_len: int) -> AttentionMetadata:
    return AttentionMetadata(query_start_loc=torch.tensor([0, qlen], dtype=torch.int32),
                             seq_lens=torch.tensor([seq_len], dtype=torch.int32), block_tables=table,
                             slot_mapping=torch.zeros(qlen, dtype=torch.int64),
                             positions=torch.arange(seq_len - qlen, seq_len), tree_mask=None,
                             query_lens=[qlen], seq_lens_host=[seq_len])


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_row_is_the_same_in_a_decode_step_and_in_a_verification(dtype):
    torch.manual_seed(0)
    k_cache, v_cache = torch.randn(16, 16, 3, 64).to(dtype), torch.randn(16, 16, 3, 64).to(dtype)
    table = torch.randperm(16)[:8].to(torch.int32)[None]
    q = torch.randn(5, 9, 64).to(dtype)
    verify = paged_attention(q, k_cache, v_cache, _meta(table, 5, 100), 0.125)  # 5 rows at positions 95..99
    for i in range(5):
        decode = paged_attention(q[i:i + 1].contiguous(), k_cache, v_cache, _meta(table, 1, 96 + i), 0.125)
        assert torch.equal(decode, verify[i:i + 1]), i


@needs_kernel
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_bf16_matches_the_reference_within_its_rounding(scenario):
    """bf16 runs the kernel too: fp32 math rounded once, against the reference's bf16 SDPA."""
    ctx, qlens, block_size, tree = SCENARIOS[scenario]
    case = paged_attention_case(ctx, qlens, 9, 3, 64, block_size, torch.bfloat16, tree=tree, seed=len(scenario))
    expected = REF.attention(*case.args()).float()
    actual = paged_attention(*case.args())
    assert actual.dtype == torch.bfloat16
    exact = REF.attention(*[a.float() if torch.is_tensor(a) and a.is_floating_point() else a
                            for a in case.args()])
    # the kernel rounds fp32 math once: within half a bf16 ulp of the fp32 result ...
    torch.testing.assert_close(actual.float(), exact, atol=1e-6, rtol=2.0 ** -8)
    # ... and within bf16's rounding of the reference's own bf16 computation
    torch.testing.assert_close(actual.float(), expected, atol=2e-2, rtol=2e-2)


def _marches() -> list[str]:
    """The -march builds this CPU can run: portable, AVX2 (haswell) where present, and its own."""
    import platform

    if platform.machine() not in ("x86_64", "AMD64"):
        return ["native"]
    from hyspec.cpu_ops.native import _cpu_key

    flags = set(_cpu_key().split())
    return ["x86-64", *(["haswell"] if {"avx2", "fma"} <= flags else []), "native"]


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("head_dim", [32, 64, 128])
def test_the_avx2_path_computes_the_portable_paths_bits(dtype, head_dim):
    """AVX2 (eight keys' dot products summed together, the value rows accumulated in registers) does the portable
    build's operations in its order: equal bit for bit, at a prefill long enough for many groups of keys (AVX-512
    sums in sixteen lanes, another order: not compared)."""
    from hyspec.cpu_ops.paged_attention import variant

    case = paged_attention_case([0, 13, 70], [150, 21, 1], 9, 3, head_dim, 16, dtype, seed=head_dim)
    portable = paged_attention(*case.args(), lib=variant("x86-64"))
    from hyspec.cpu_ops.native import _cpu_key

    for march in _marches()[1:]:
        if march == "native" and "avx512f" in _cpu_key().split():
            continue
        lib = variant(march)
        assert torch.equal(paged_attention(*case.args(), lib=lib), portable), march


def test_other_dtypes_run_the_reference():
    case = paged_attention_case([10], [2], 4, 2, 32, 16, torch.float16, seed=1)
    assert torch.equal(paged_attention(*case.args()), REF.attention(*case.args()))


@needs_kernel
def test_the_cpu_backend_uses_it():
    from hyspec.backends.registry import get_backend

    assert "attention" in get_backend("cpu").ops.native_ops()
