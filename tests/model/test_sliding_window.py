"""Sliding-window attention (Mistral ``sliding_window``, Qwen2/Qwen3 ``use_sliding_window`` +
``max_window_layers`` / ``layer_types``): read from the config, honoured in prefill, decode and tree
verification on the reference and CPU op tables, refused where an op table cannot honour it.

transformers' own comparison is tests/model/test_numerics_vs_transformers.py (families ``mistral_window``
and ``qwen2_window``, window 8, 75 positions); on main at 7185667 both fail (the window was ignored).
"""
from __future__ import annotations

import pytest
import torch

from hyspec.errors import CheckpointError
from hyspec.kv.sequence_kv import SequenceKV
from hyspec.model.config import ModelConfig
from hyspec.model.loader import load_model
from hyspec.ops import reference_ops
from hyspec.seam.forward import ALL_LOGITS, LAST_LOGITS, Feed
from tests.model.hf_fixtures import make_hf_model
from tests.model.paged_decode import make_runner
from tests.model.test_tree_attention import ancestor_mask, path_to

WINDOW = 8
BASE = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=4096)


@pytest.mark.parametrize("extra, windows", [
    ({"model_type": "mistral", "sliding_window": 4096}, (4096,) * 4),
    ({"model_type": "mistral", "sliding_window": None}, ()),
    ({"model_type": "qwen2", "sliding_window": 32768, "use_sliding_window": False, "max_window_layers": 2}, ()),
    ({"model_type": "qwen2", "sliding_window": 64, "use_sliding_window": True, "max_window_layers": 2},
     (None, None, 64, 64)),
    ({"model_type": "qwen3", "sliding_window": 64, "use_sliding_window": True,
      "layer_types": ["sliding_attention", "full_attention"] * 2}, (64, None, 64, None)),
    ({"model_type": "llama", "sliding_window": 64}, ()),  # transformers' Llama has no window
])
def test_windows_per_layer_as_transformers_reads_the_config(extra, windows):
    cfg = ModelConfig.from_dict({**BASE, **extra})
    assert cfg.layer_windows == windows
    # a window as long as the positions the model will ever see cuts nothing: plain causal attention
    assert [cfg.sliding_window(i, 64) for i in range(4)] == [w if w is not None and w < 64 else None
                                                               for w in (windows or (None,) * 4)]


def test_unknown_layer_types_are_refused_by_name():
    with pytest.raises(CheckpointError, match="chunked_attention"):
        ModelConfig.from_dict({**BASE, "model_type": "qwen2", "sliding_window": 64, "use_sliding_window": True,
                               "layer_types": ["chunked_attention"] * 4})


@pytest.fixture(scope="module")
def window_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("mistral_window")
    make_hf_model("mistral_window", path, layers=2, seed=4)
    return path


def _cpu_ops():
    from hyspec.backends.optable import resolve_ops

    table = resolve_ops("hyspec.cpu_ops", "cpu_op_overrides", source="cpu_ops").table
    if table.sources["attention"] == "reference":
        pytest.skip("the CPU attention kernel is not built here")
    return table


@pytest.mark.parametrize("ops", ["reference", "cpu"])
def test_tree_verification_past_the_window_equals_each_path_alone(window_dir, ops):
    """Context 14 > window 8, trees 7 deep: each node sees what its root-to-node path sees in plain decoding,
    the window measured in positions (a node at depth d is stored at c + k but sits at position c + d)."""
    model = load_model(window_dir, dtype="float32", ops=reference_ops() if ops == "reference" else _cpu_ops())
    pool, layout, runner = make_runner(model, pages=64, block_size=4)
    g = torch.Generator().manual_seed(0)
    trees = [[-1, 0, 0, 1, 3, 2, 4, 6, 7, 5], [-1, 0, 1, 2]]
    seqs = []
    for ctx_len, parents in zip((14, 5), trees):
        kv = SequenceKV(pool, layout)
        ctx = torch.randint(3, 128, (ctx_len,), generator=g).tolist()
        kv.reserve(ctx_len + len(parents))
        runner.run([Feed(kv, ctx, 0, logits=LAST_LOGITS)])
        seqs.append((kv, ctx, torch.randint(3, 128, (len(parents),), generator=g).tolist(), parents))
    depth = lambda parents: [len(path_to(parents, i)) - 1 for i in range(len(parents))]  # noqa: E731
    out = runner.run([Feed(kv, toks, len(ctx), depths=depth(par), tree_mask=ancestor_mask(par), logits=ALL_LOGITS)
                      for kv, ctx, toks, par in seqs])
    for b, (kv, ctx, toks, parents) in enumerate(seqs):
        for i in range(len(parents)):
            solo = SequenceKV(pool, layout)
            path = [toks[j] for j in path_to(parents, i)]
            solo.reserve(len(ctx) + len(path))
            ref = runner.run([Feed(solo, ctx + path, 0, logits=LAST_LOGITS)]).logits[0]
            torch.testing.assert_close(out.feed_logits(b)[i], ref, atol=1e-4, rtol=1e-4)
            solo.release()
        kv.release()
    pool.assert_all_free()


def test_dense_forward_honours_the_window(window_dir):
    import transformers

    hf = transformers.MistralForCausalLM.from_pretrained(window_dir, dtype=torch.float32).eval()
    model = load_model(window_dir, dtype="float32")
    ids = torch.randint(3, 128, (2, 30), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = hf(ids).logits
    torch.testing.assert_close(model.compute_logits(model.forward_dense(ids).hidden), ref, atol=1e-4, rtol=1e-4)


def test_an_op_table_without_window_support_refuses_the_model(window_dir):
    def full_attention(q, k_cache, v_cache, meta, scale):  # a kernel that knows nothing of windows
        raise AssertionError("never called")

    ops = reference_ops().with_overrides("some_kernel", attention=full_attention)
    with pytest.raises(CheckpointError, match="sliding-window attention.*'some_kernel'"):
        load_model(window_dir, dtype="float32", ops=ops)
    # within the window nothing is cut: the same kernel serves it
    assert load_model(window_dir, dtype="float32", ops=ops, max_positions=WINDOW).layers[0].self_attn.sliding_window is None


def test_speculative_methods_past_the_window_return_plain_decodings_tokens(window_dir):
    """ngram chains, the target as its own draft model, and random trees (the oracle proposer) at
    temperature 0, 40 tokens past an 8-token window, on the CPU backend."""
    from hyspec import LLM, SamplingParams
    from tests.spec.oracle_tree import OracleTreeProposer

    prompts = [[5, 9, 17, 5, 9, 17, 33, 40, 5, 9], [60, 61, 62], [7] * 12]
    greedy = SamplingParams(temperature=0, max_tokens=40)
    args = dict(dtype="float32", backend="cpu", kv_cache_bytes=8 << 20, skip_tokenizer_init=True)
    fast = {"controller": {"enabled": False, "profile_at_startup": False}}

    def run(spec=None, proposer=None):
        with LLM(str(window_dir), speculative_config=None if spec is None else {**fast, **spec}, **args) as llm:
            if proposer is not None:
                llm.engine.spec.proposers["ngram"] = proposer
            tokens = [o.outputs[0].token_ids for o in llm.generate(prompts, greedy)]
            if spec is not None:
                assert llm.engine.spec.metrics.snapshot()["totals"]["accepted_tokens"] > 0  # it speculated
            return tokens

    plain = run()
    assert run({"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1,
                "prompt_lookup_max": 3}) == plain
    assert run({"method": "draft_model", "model": str(window_dir), "num_speculative_tokens": 4,
                "quantization": "none"}) == plain
    refs = {tuple(p): out for p, out in zip(prompts, plain)}
    assert run({"method": "ngram", "num_speculative_tokens": 8}, OracleTreeProposer(refs, 128, seed=1)) == plain


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_cpu_kernel_windows_as_the_reference_does_and_a_row_is_the_same_in_decode_and_verify(dtype):
    """cpu_ops/paged_attention.c with a window against the reference op (decode, prefill, a tree whose nodes
    sit at depth positions), and its property kept under the window: a query row gives the same bits in a
    decode step and inside a verification, in every ISA build this CPU runs."""
    from hyspec.cpu_ops import paged_attention as cpu
    from hyspec.cuda_ops.cases import paged_attention_case
    from tests.test_cpu_ops_attention import _meta
    from tests.test_cpu_ops_dense_gemm import MARCHES  # portable, AVX2 where the CPU has it, native

    if cpu.library() is None:
        pytest.skip("no C compiler here: the attention kernel cannot build")
    for ctx, qlens, tree in (([70, 40, 5], [1, 1, 1], False), ([0, 13], [33, 20], False),
                             ([20, 70, 0], [8, 1, 13], True)):
        case = paged_attention_case(ctx, qlens, 9, 3, 64, 16, dtype, tree=tree, seed=3)
        expected = reference_ops().attention(*case.args(), sliding_window=WINDOW)
        torch.testing.assert_close(cpu.paged_attention(*case.args(), sliding_window=WINDOW), expected,
                                   atol=2e-6 if dtype == torch.float32 else 2e-2, rtol=1e-5 if dtype == torch.float32 else 2e-2)
    torch.manual_seed(0)
    k_cache, v_cache = torch.randn(16, 16, 3, 64).to(dtype), torch.randn(16, 16, 3, 64).to(dtype)
    table = torch.randperm(16)[:8].to(torch.int32)[None]
    q = torch.randn(5, 9, 64).to(dtype)
    for march in MARCHES:
        lib = cpu.variant(march)
        if lib is None:
            continue
        verify = cpu.paged_attention(q, k_cache, v_cache, _meta(table, 5, 100), 0.125, lib=lib, sliding_window=WINDOW)
        for i in range(5):
            decode = cpu.paged_attention(q[i:i + 1].contiguous(), k_cache, v_cache, _meta(table, 1, 96 + i), 0.125,
                                         lib=lib, sliding_window=WINDOW)
            assert torch.equal(decode, verify[i:i + 1]), (march, i)
