"""Sliding-window attention in the Triton paged-attention kernel vs the reference, under TRITON_INTERPRET=1.

A query at position ``p`` sees, of what it would see without a window, the entries at positions ``> p - w``
(``hyspec.ops.attention.visibility_mask``).  Cases: decode, prefill and chain steps (causal) and draft trees
whose nodes sit at depth positions; windows smaller than a KV page, straddling pages and key tiles, and larger
than the context (then the kernel's result is the unwindowed one, bit for bit).  Shapes are tiny: the
interpreter runs each program in numpy.
"""
from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"  # before the kernel modules import triton's jit

import pytest  # noqa: E402
import torch  # noqa: E402

pytest.importorskip("triton")

from hyspec.cuda_ops.attention import AttentionConfig, triton_paged_attention  # noqa: E402
from hyspec.cuda_ops.cases import paged_attention_case  # noqa: E402
from hyspec.cuda_ops.common import KernelInputError  # noqa: E402
from hyspec.cuda_ops.tolerances import tolerance  # noqa: E402
from hyspec.kv.sequence_kv import SequenceKV  # noqa: E402
from hyspec.model.loader import load_model  # noqa: E402
from hyspec.ops import reference_ops  # noqa: E402
from hyspec.ops.attention import AttentionMetadata  # noqa: E402
from hyspec.seam.forward import ALL_LOGITS, LAST_LOGITS, Feed  # noqa: E402
from tests.model.paged_decode import make_runner  # noqa: E402
from tests.model.test_sliding_window import WINDOW, window_dir  # noqa: E402,F401  (the fixture)

REF = reference_ops()
#: partitions of 64 keys in tiles of 32: tiny contexts still cross tiles, partitions and the split merge
SPLIT = AttentionConfig(block_m=32, block_n=32, partition_size=64)
SINGLE = AttentionConfig(block_m=32, block_n=32, partition_size=64, split_max_query_len=0)

# (context_lens, query_lens, block_size, tree); pages of 16 keys
SCENARIOS = {
    "decode": ([70, 40, 5], [1, 1, 1], False),
    "prefill": ([0, 13], [33, 20], False),  # a cold prefill and a chunk after 13 committed tokens
    "tree": ([20, 70, 0], [8, 1, 13], True),  # nodes at position context + depth, stored at context + k
}
# 3: inside one page; 20: straddles pages and key tiles; 1000: past every context (the unwindowed result)
WINDOWS = [3, 20, 1000]


def check(case, window: int, config: AttentionConfig) -> torch.Tensor:
    expected = REF.attention(*case.args(), sliding_window=window)
    actual = triton_paged_attention(*case.args(), sliding_window=window, config=config)
    tolerance("attention", case.q.dtype).check(actual, expected, f"attention window {window} {case.q.dtype}")
    return actual


@pytest.mark.parametrize("window", WINDOWS)
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_the_window_matches_the_reference(scenario: str, window: int) -> None:
    ctx, qlens, tree = SCENARIOS[scenario]
    case = paged_attention_case(ctx, qlens, 4, 2, 32, 16, torch.float32, tree=tree, seed=len(scenario) + window)
    actual = check(case, window, SPLIT)
    if window == 1000:  # the same key tiles, every mask bit true: exactly the unwindowed kernel
        assert torch.equal(actual, triton_paged_attention(*case.args(), config=SPLIT))
    if window == 20:  # one program walks the whole key range (no split-KV): the same rule
        check(case, window, SINGLE)


def test_bf16_and_grouped_heads_under_a_window() -> None:
    """bf16 inputs (tensor-core numerics), GQA 4 and a tree beside decodes, window 11 (not a tile multiple)."""
    case = paged_attention_case([90, 33, 4], [1, 7, 5], 8, 2, 32, 16, torch.bfloat16, tree=True, seed=7)
    check(case, 11, SPLIT)


def test_keys_before_the_window_are_never_read() -> None:
    """What a window buys: the keys wholly before a program's window are skipped, not masked.  Every page
    before the first key tile any query can see is poisoned with NaN (a masked key would still meet
    ``0 * NaN`` in P.V); the result stays finite and equal to the reference on the clean cache."""
    window, block_n = 20, SPLIT.block_n
    case = paged_attention_case([200, 150], [1, 4], 4, 2, 32, 16, torch.float32, seed=5)
    expected = REF.attention(*case.args(), sliding_window=window)
    for b, (ctx, n) in enumerate(zip([200, 150], [1, 4])):
        first_visible = ctx - window + 1  # the earliest query's position is the context length
        unread_pages = (first_visible // block_n * block_n) // 16
        assert unread_pages >= 8
        pages = case.meta.block_tables[b, :unread_pages].long()
        case.k_cache[pages] = float("nan")
        case.v_cache[pages] = float("nan")
    actual = triton_paged_attention(*case.args(), sliding_window=window, config=SPLIT)
    tolerance("attention", torch.float32).check(actual, expected, "attention with poisoned keys before the window")


def test_a_row_is_the_same_in_decode_and_in_chain_verification_under_a_window() -> None:
    """docs/architecture.md §4 kept with a window: skipped key tiles would have contributed exact zeros, so a
    chain token verified among others equals the same token decoded alone (up to the interpreter's BLAS; on
    a GPU bitwise, checked by scripts/gpu_check.py's attention case)."""
    from tests.test_cuda_ops_attention import _interpreter_matmul_is_row_invariant

    ctx, n, window = 60, 6, 20  # the chain's window starts in the first partition and ends in the second
    case = paged_attention_case([ctx], [n], 8, 2, 32, 16, torch.float32, seed=11)
    batched = triton_paged_attention(*case.args(), sliding_window=window, config=SPLIT)
    m = case.meta
    for i in range(n):
        alone = AttentionMetadata(
            query_start_loc=torch.tensor([0, 1], dtype=torch.int32),
            seq_lens=torch.tensor([ctx + i + 1], dtype=torch.int32), block_tables=m.block_tables,
            slot_mapping=m.slot_mapping[i:i + 1], positions=m.positions[i:i + 1], tree_mask=None,
            query_lens=[1], seq_lens_host=[ctx + i + 1])
        single = triton_paged_attention(case.q[i:i + 1], case.k_cache, case.v_cache, alone, case.scale,
                                        sliding_window=window, config=SPLIT)
        if _interpreter_matmul_is_row_invariant():
            assert torch.equal(single[0], batched[i]), f"token {i} differs between decode and verification"
        else:
            torch.testing.assert_close(single[0], batched[i], atol=1e-6, rtol=1e-5)


def test_static_bounds_under_a_window_give_the_steps_own_result() -> None:
    """Launching for fixed bounds (a captured graph's launch) with a window: the extra partitions are empty."""
    case = paged_attention_case([70, 300], [1, 1], 4, 2, 32, 16, torch.bfloat16, seed=21)
    own = triton_paged_attention(*case.args(), sliding_window=40, config=SPLIT)
    assert torch.equal(own, triton_paged_attention(*case.args(), sliding_window=40, config=SPLIT,
                                                   static_bounds=(1, 512)))


def test_a_bad_window_is_refused() -> None:
    case = paged_attention_case([4], [2], 4, 2, 32, 16, torch.float32)
    for bad in (0, -3, 2.5, True):
        with pytest.raises(KernelInputError, match="sliding_window must be a positive integer"):
            triton_paged_attention(*case.args(), sliding_window=bad)


def test_a_windowed_model_runs_on_the_triton_attention_as_on_the_reference(window_dir) -> None:
    """A Mistral with window 8 (tests/model/test_sliding_window.py's) loads on an op table whose attention is
    the Triton kernel (it was refused before) and gives the reference table's logits for a prefill past the
    window, a decode and a draft tree 7 deep whose nodes sit at depth positions."""
    from hyspec.cuda_ops import cuda_op_overrides

    triton_table = reference_ops().with_overrides("triton", attention=cuda_op_overrides()["attention"])
    assert getattr(triton_table.attention, "supports_sliding_window", False)
    parents = [-1, 0, 0, 1, 3, 2, 4, 6, 7, 5]
    mask = torch.zeros(len(parents), len(parents), dtype=torch.bool)
    depths = []
    for i, parent in enumerate(parents):
        if parent >= 0:
            mask[i] = mask[parent]
        mask[i, i] = True
        depths.append(int(mask[i].sum()) - 1)
    g = torch.Generator().manual_seed(0)
    ctx = torch.randint(3, 128, (14,), generator=g).tolist()
    tree_tokens = torch.randint(3, 128, (len(parents),), generator=g).tolist()
    logits = []
    for table in (REF, triton_table):
        model = load_model(window_dir, dtype="float32", ops=table)
        assert model.layers[0].self_attn.sliding_window == WINDOW
        pool, layout, runner = make_runner(model, pages=32, block_size=4)
        kv = SequenceKV(pool, layout)
        kv.reserve(len(ctx) + 1 + len(parents))
        prefill = runner.run([Feed(kv, ctx, 0, logits=ALL_LOGITS)]).logits
        decode = runner.run([Feed(kv, [5], len(ctx), logits=LAST_LOGITS)]).logits
        tree = runner.run([Feed(kv, tree_tokens, len(ctx) + 1, depths=depths, tree_mask=mask,
                                logits=ALL_LOGITS)]).logits
        logits.append(torch.cat([prefill, decode, tree]))
        kv.release()
    torch.testing.assert_close(logits[1], logits[0], atol=1e-4, rtol=1e-4)
