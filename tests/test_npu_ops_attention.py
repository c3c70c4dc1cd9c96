"""NPU attention wrapper vs the reference, on CPU, through an emulated torch_npu.

``hyspec.npu_ops.emulation`` computes what the torch_npu documentation says
FIA and ATB paged attention compute, and rejects arguments the docs rule
out.  Matching the reference through it shows the wrapper's argument
plumbing (layouts, cumulative vs per-request lengths, scaled block tables of
the strided pool, the tree mask and its splitting) agrees with our reading
of the docs -- not that the real kernels agree; that needs an Ascend machine.
"""
from __future__ import annotations

import re
import sys

import pytest
import torch

from hyspec.cuda_ops.cases import paged_attention_case
from hyspec.npu_ops.attention import NpuAttention, NpuAttentionConfig
from hyspec.npu_ops.emulation import fake_torch_npu
from hyspec.npu_ops.layout import PagedCache
from hyspec.npu_ops.limits import NpuOpUnsupportedError
from hyspec.npu_ops.tolerances import tolerance
from hyspec.ops import reference_ops

REF = reference_ops()
DTYPES = [torch.bfloat16, torch.float16]

# (context_lens, query_lens, block_size, tree).  PageAttention with more than one query row takes block sizes
# that are multiples of 128 (the FIA doc); single-token decode takes multiples of 16.
SCENARIOS = {
    "decode": ([70, 40, 5], [1, 1, 1], 16, False),  # 70 crosses four blocks
    "prefill": ([0, 120], [33, 20], 128, False),  # a cold prefill; the second crosses a block boundary
    "ragged": ([0, 30, 7, 250], [9, 1, 4, 8], 128, False),
    "tree": ([20, 170, 0], [8, 1, 13], 128, True),
    "big_tree": ([45, 2], [20, 40], 128, True),  # 20 and 40 rows: split into 16-row entries
}


@pytest.fixture
def npu(monkeypatch):
    module = fake_torch_npu()
    monkeypatch.setitem(sys.modules, "torch_npu", module)
    return module


def attention_op(module, **config) -> NpuAttention:
    """The wrapper as npu_op_overrides builds it: with the emulated release's documented limits."""
    from hyspec.npu_ops.op_schemas import load_release

    return NpuAttention(module.npu_fused_infer_attention_score, getattr(module, "_npu_paged_attention", None),
                        NpuAttentionConfig(**config), limits=load_release(module.HYSPEC_EMULATION))


def called(module, name: str) -> list[dict]:
    return [kwargs for fn, _args, kwargs in module.calls if fn == name]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("scenario", SCENARIOS)
@pytest.mark.parametrize("heads", [(4, 4), (9, 3)], ids=["mha", "gqa3"])
@pytest.mark.parametrize("head_dim", [64, 128], ids=["d64", "d128"])
def test_matches_reference(npu, dtype: torch.dtype, scenario: str, heads: tuple[int, int], head_dim: int) -> None:
    """D = 64 (SmolLM2) and D = 128: every step goes to a documented FIA/PA call, and agrees with the reference."""
    ctx, qlens, block_size, tree = SCENARIOS[scenario]
    case = paged_attention_case(ctx, qlens, *heads, head_dim, block_size, dtype, tree=tree, seed=len(scenario))
    expected = REF.attention(*case.args())
    actual = attention_op(npu)(*case.args())
    tolerance("attention", dtype).check(actual, expected, f"{scenario} {dtype}")
    assert {c[0] for c in npu.calls} & {"npu_fused_infer_attention_score", "_npu_paged_attention"}


@pytest.mark.parametrize("version, head_dim, layout", [
    ("26.1.0", 128, "TND"),  # documented: TND without rope takes D = 128
    ("26.1.0", 64, "BSND"),  # D = 64 is not in TND's list: an explicit causal mask on BSND
    ("7.1.0", 128, "BSND"),  # 7.1.0's TND takes no PageAttention at all
])
def test_causal_layout_follows_the_release(monkeypatch, version, head_dim, layout) -> None:
    from hyspec.npu_ops.op_schemas import load_release

    module = fake_torch_npu(version=version)
    monkeypatch.setitem(sys.modules, "torch_npu", module)
    case = paged_attention_case([0, 150], [40, 3], 9, 3, head_dim, 128, torch.bfloat16, seed=3)
    op = NpuAttention(module.npu_fused_infer_attention_score, None, limits=load_release(version))
    tolerance("attention", torch.bfloat16).check(op(*case.args()), REF.attention(*case.args()), layout)
    (kw,) = called(module, "npu_fused_infer_attention_score")
    assert kw["input_layout"] == layout and kw["sparse_mode"] == (3 if layout == "TND" else 0)


def test_the_emulation_rejects_what_the_release_does_not_document(monkeypatch) -> None:
    """Called directly, FIA on 7.1.0 refuses TND PageAttention, as the real op's check would (RuntimeError)."""
    from hyspec.npu_ops.emulation import EmulationError

    old = fake_torch_npu(version="7.1.0")
    case = paged_attention_case([0], [5], 4, 4, 128, 128, torch.bfloat16, seed=1)
    op = NpuAttention(old.npu_fused_infer_attention_score)  # no limits given: it would try TND
    with pytest.raises(EmulationError, match="TND.*not documented"):
        op(*case.args())
    assert issubclass(EmulationError, RuntimeError)
    small_blocks = paged_attention_case([0], [5], 4, 4, 128, 16, torch.bfloat16, seed=1)
    with pytest.raises(EmulationError, match="multiple of 128"):
        NpuAttention(fake_torch_npu().npu_fused_infer_attention_score)(*small_blocks.args())


def test_causal_step_is_one_tnd_call_with_documented_arguments(npu) -> None:
    case = paged_attention_case([0, 30, 7], [9, 1, 4], 8, 2, 128, 128, torch.bfloat16, seed=1)
    attention_op(npu)(*case.args())
    (kw,) = called(npu, "npu_fused_infer_attention_score")
    (_, (query, key, value), _) = [c for c in npu.calls if c[0] == "npu_fused_infer_attention_score"][0]
    assert kw["input_layout"] == "TND" and kw["sparse_mode"] == 3 and kw["block_size"] == 128
    assert kw["actual_seq_lengths"] == [9, 10, 14]  # cumulative query ends
    assert kw["actual_seq_lengths_kv"] == [9, 31, 11]  # per request, new tokens included
    assert kw["num_heads"] == 8 and kw["num_key_value_heads"] == 2 and kw["scale"] == case.scale
    assert kw["atten_mask"].dtype == torch.int8 and torch.equal(
        kw["atten_mask"].bool(), torch.ones(2048, 2048, dtype=torch.bool).triu(1))
    assert query.shape == (14, 8, 128) and key.shape[1:] == (128, 2 * 128) and key.is_contiguous()
    stride = case.k_cache.stride(0) // (128 * 2 * 128)  # pool pages hold 2 layers x (K, V) blocks
    width = -(-31 // 128)  # the table is trimmed to the longest sequence's blocks
    assert torch.equal(kw["block_table"], case.meta.block_tables[:, :width] * stride)
    assert kw["block_table"].dtype == torch.int32


def test_tree_call_uses_an_explicit_mask_with_the_context_prefix(npu) -> None:
    case = paged_attention_case([5, 0], [3, 2], 4, 4, 64, 128, torch.bfloat16, tree=True, seed=4)
    attention_op(npu)(*case.args())
    (kw,) = called(npu, "npu_fused_infer_attention_score")
    assert kw["input_layout"] == "BSND" and kw["sparse_mode"] == 0
    assert kw["actual_seq_lengths"] == [3, 2] and kw["actual_seq_lengths_kv"] == [8, 2]
    mask = kw["atten_mask"]
    assert mask.dtype == torch.bool and mask.shape == (2, 1, 3, 128)  # KV_S = table width * block_size
    visible = ~mask[0, 0]
    tree = case.meta.tree_mask[:3, :3]
    assert visible[:, :5].all()  # the 5 context keys
    assert torch.equal(visible[:, 5:8], tree)  # True = masked out, so visible == ancestor-or-self
    assert not visible[:, 8:].any()
    assert torch.equal(~mask[1, 0, 2], torch.tensor([True] + [False] * 127))  # a padding row sees key 0 only


def test_large_tree_is_split_into_16_row_entries(npu) -> None:
    case = paged_attention_case([45, 2], [20, 40], 4, 2, 64, 128, torch.bfloat16, tree=True, seed=7)
    expected = REF.attention(*case.args())
    actual = attention_op(npu)(*case.args())
    (kw,) = called(npu, "npu_fused_infer_attention_score")
    assert kw["actual_seq_lengths"] == [16, 4, 16, 16, 8]
    assert kw["actual_seq_lengths_kv"] == [65, 65, 42, 42, 42]
    assert kw["block_table"].shape[0] == 5
    tolerance("attention", torch.bfloat16).check(actual, expected, "split tree")


def test_large_tree_raises_before_launch_when_splitting_is_off(npu) -> None:
    case = paged_attention_case([3], [17], 4, 2, 64, 128, torch.bfloat16, tree=True, seed=2)
    with pytest.raises(NpuOpUnsupportedError, match="17 tree tokens.*at most 16"):
        attention_op(npu, split_large_trees=False)(*case.args())
    assert npu.calls == []


def test_decode_uses_paged_attention_and_falls_back_to_fia_without_it(npu, monkeypatch) -> None:
    case = paged_attention_case([70, 3], [1, 1], 4, 2, 32, 16, torch.float16, seed=3)
    expected = REF.attention(*case.args())
    tolerance("attention", torch.float16).check(attention_op(npu)(*case.args()), expected, "PA")
    (kw,) = called(npu, "_npu_paged_attention")
    assert kw["context_lens"].tolist() == [71, 4] and kw["context_lens"].device.type == "cpu"
    assert kw["block_table"].dtype == torch.int32 and kw["num_kv_heads"] == 2 and kw["num_heads"] == 4
    without = fake_torch_npu(missing=["_npu_paged_attention"])
    monkeypatch.setitem(sys.modules, "torch_npu", without)
    tolerance("attention", torch.float16).check(attention_op(without)(*case.args()), expected, "FIA decode")
    assert [c[0] for c in without.calls] == ["npu_fused_infer_attention_score"]


def test_paged_attention_is_skipped_where_atb_does_not_document_the_shape(npu) -> None:
    """ATB PagedAttention: head_size * block_size <= 128 * 128; D=128 with 256-token blocks is over."""
    case = paged_attention_case([300], [1], 2, 2, 128, 256, torch.bfloat16, seed=5, num_layers=1, layer=0)
    attention_op(npu)(*case.args())
    assert [c[0] for c in npu.calls] == ["npu_fused_infer_attention_score"]


@pytest.mark.parametrize("problem, args, match", [
    ("fp32", dict(heads=(4, 2), head_dim=64, block_size=128, dtype=torch.float32), "float16/bfloat16"),
    ("head_dim", dict(heads=(4, 2), head_dim=40, block_size=128, dtype=torch.bfloat16), "head_dim 40"),
    ("block_size", dict(heads=(4, 2), head_dim=64, block_size=8, dtype=torch.bfloat16), "block_size 8"),
    ("small_blocks", dict(heads=(4, 2), head_dim=64, block_size=16, dtype=torch.bfloat16), "multiple of 128"),
])
def test_shapes_fia_does_not_document_run_the_reference(npu, problem, args, match) -> None:
    """No kernel call the docs rule out: the step runs the reference op and the log says which limit."""
    case = paged_attention_case([5], [3], *args["heads"], args["head_dim"], args["block_size"], args["dtype"])
    from hyspec.npu_ops import limits

    actual = attention_op(npu)(*case.args())
    assert npu.calls == []
    assert torch.equal(actual, REF.attention(*case.args()))
    assert any(re.search(match, key) for key in limits._warned)  # warned once per process, naming the limit


def test_inconsistent_heads_raise_before_launch(npu) -> None:
    case = paged_attention_case([5], [3], 6, 4, 64, 128, torch.bfloat16)
    with pytest.raises(NpuOpUnsupportedError, match="not a multiple of 4 KV"):
        attention_op(npu)(*case.args())
    assert npu.calls == []


def test_the_tree_mask_is_built_once_per_step(npu, monkeypatch) -> None:
    import hyspec.npu_ops.attention as attention

    built = []
    real = attention.tree_args
    monkeypatch.setattr(attention, "tree_args", lambda *a, **k: built.append(1) or real(*a, **k))
    case = paged_attention_case([4, 9], [3, 5], 4, 2, 64, 128, torch.bfloat16, tree=True, seed=8)
    op = attention_op(npu)
    first, second = op(*case.args()), op(*case.args())  # two layers of one step
    assert len(built) == 1 and torch.equal(first, second)
    op(*paged_attention_case([4, 9], [3, 5], 4, 2, 64, 128, torch.bfloat16, tree=True, seed=9).args())
    assert len(built) == 2  # a new step's metadata builds its own


def test_a_broken_block_table_is_caught(npu, monkeypatch) -> None:
    """The check has teeth: forgetting to scale block ids to the pool's virtual blocks reads the wrong pages."""
    monkeypatch.setattr(PagedCache, "block_table", lambda self, table: table.to(torch.int32).contiguous())
    case = paged_attention_case([200, 330], [4, 1], 4, 2, 64, 128, torch.bfloat16, seed=6)
    expected = REF.attention(*case.args())
    with pytest.raises(AssertionError, match="out of tolerance"):
        tolerance("attention", torch.bfloat16).check(attention_op(npu)(*case.args()), expected, "broken")
