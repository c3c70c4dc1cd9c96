"""Gemma 2, Gemma 3 (text) and Phi-3 beyond the paged comparison of test_numerics_vs_transformers.py (which
covers every family in hf_fixtures): the dense path, configs as published, refusals, tree verification with
soft-capped attention, and speculative decoding's identity with plain decoding."""
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


@pytest.fixture(scope="module")
def gemma2_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("gemma2")
    make_hf_model("gemma2", path, layers=2, seed=5)
    return path


@pytest.mark.parametrize("family", ["gemma2", "gemma3_softcap", "phi3_window"])
def test_dense_forward_matches_transformers(family, tmp_path):
    """The cache-free path (training, teacher forcing): windows, soft-caps and both RoPE tables, batch of 2."""
    hf = make_hf_model(family, tmp_path)
    model = load_model(tmp_path, dtype="float32")
    ids = torch.randint(3, 128, (2, 30), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ref = hf(ids).logits.float()
        out = model.compute_logits(model.forward_dense(ids).hidden)
    torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)


def _bf16_drift(fp32_logits: torch.Tensor, bf16_logits: torch.Tensor) -> float:
    """Mean over sequences of the largest logit error in units of the 4-ulp bf16 bound of
    test_numerics_vs_transformers.py::test_low_precision_loads_and_tracks_fp32 (per sequence)."""
    a, b = fp32_logits.float(), bf16_logits.float()
    bound = 4 * torch.finfo(torch.bfloat16).eps * (a.abs() + a.pow(2).mean((1, 2), keepdim=True).sqrt())
    return float(((a - b).abs() / bound).amax((1, 2)).mean())


@pytest.mark.parametrize("family", ["gemma2", "gemma2_mqa", "gemma3", "gemma3_softcap"])
def test_bf16_drifts_from_fp32_no_more_than_transformers(family, tmp_path):
    """Gemma's ``1 + w`` norms multiply in fp32 and round once in transformers; rounding the normed activations
    and ``1 + w`` to bf16 first (hyspec before issue 48) drifted 1.12x to 1.22x transformers' own bf16 drift
    here; now 0.94x to 1.00x.  A single sequence is too noisy to tell (transformers passes the 4-ulp bound on
    some and not others), so the mean over 64 is compared with transformers' on the same tokens."""
    hf = make_hf_model(family, tmp_path)
    ids = torch.randint(3, 128, (64, 16), generator=torch.Generator().manual_seed(0))
    fp32, bf16 = load_model(tmp_path, dtype="float32"), load_model(tmp_path, dtype="bfloat16")
    with torch.no_grad():
        ours = _bf16_drift(fp32.compute_logits(fp32.forward_dense(ids).hidden),
                           bf16.compute_logits(bf16.forward_dense(ids).hidden))
        theirs = _bf16_drift(hf(ids).logits, hf.to(torch.bfloat16)(ids).logits)
    assert ours <= 1.08 * theirs, f"hyspec bf16 {ours:.3f}x the bound on average, transformers {theirs:.3f}x"


GEMMA3_AS_PUBLISHED = {  # google/gemma-3-4b-it's text_config keys, written by transformers 4 (sizes shrunk)
    "model_type": "gemma3_text", "vocab_size": 128, "hidden_size": 64, "intermediate_size": 128,
    "num_hidden_layers": 12, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
    "hidden_activation": "gelu_pytorch_tanh", "query_pre_attn_scalar": 16, "rope_theta": 1000000.0,
    "rope_local_base_freq": 10000.0, "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
    "sliding_window": 1024, "sliding_window_pattern": 6, "final_logit_softcapping": None,
    "attn_logit_softcapping": None, "max_position_embeddings": 131072}


def test_configs_as_published_read_as_transformers_reads_them():
    cfg = ModelConfig.from_dict(GEMMA3_AS_PUBLISHED)
    assert cfg.layer_windows == tuple(None if (i + 1) % 6 == 0 else 1024 for i in range(12))  # 5 local : 1 global
    assert (cfg.rope.rope_type, cfg.rope.theta, cfg.rope.factor) == ("linear", 1e6, 8.0)
    assert (cfg.local_rope.rope_type, cfg.local_rope.theta) == ("default", 10000.0)
    assert cfg.tie_word_embeddings and cfg.qk_norm and cfg.attn_logit_softcapping is None
    gemma2 = ModelConfig.from_dict({**GEMMA3_AS_PUBLISHED, "model_type": "gemma2", "num_hidden_layers": 4,
                                    "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0,
                                    "sliding_window": 4096, "hidden_act": "gelu_pytorch_tanh"})
    assert gemma2.layer_windows == (4096, None, 4096, None)  # alternating, sliding first
    assert (gemma2.attn_logit_softcapping, gemma2.final_logit_softcapping) == (50.0, 30.0)
    assert gemma2.local_rope is None and not gemma2.qk_norm
    phi3 = ModelConfig.from_dict({"model_type": "phi3", "vocab_size": 128, "hidden_size": 64,
                                  "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
                                  "sliding_window": 2047, "rope_scaling": None, "hidden_act": "silu"})
    assert phi3.layer_windows == (2047, 2047)  # Phi-3-mini-4k: every layer


@pytest.mark.parametrize("change, message", [
    ({"model_type": "phi3", "hidden_act": "silu", "rope_scaling": {"type": "dynamic", "factor": 2.0}},
     "Phi-3 rope_scaling 'dynamic' is not supported; Phi-3 runs default RoPE or 'longrope'"),
    ({"hidden_activation": "gelu"}, "hidden_activation 'gelu' is not supported for gemma3_text"),
    ({"query_pre_attn_scalar": -1}, "query_pre_attn_scalar must be a positive number"),
])
def test_what_is_not_implemented_is_refused_by_name(change, message):
    with pytest.raises(CheckpointError, match=message):
        ModelConfig.from_dict({**GEMMA3_AS_PUBLISHED, **change})


def test_an_attention_op_without_softcap_refuses_gemma2(gemma2_dir):
    def plain_attention(q, k_cache, v_cache, meta, scale, sliding_window=None):  # knows windows, not caps
        raise AssertionError("never called")

    plain_attention.supports_sliding_window = True
    ops = reference_ops().with_overrides("some_kernel", attention=plain_attention)
    with pytest.raises(CheckpointError, match=r"soft-caps its attention scores.*'some_kernel'"):
        load_model(gemma2_dir, dtype="float32", ops=ops)


def _cpu_ops():
    from hyspec.backends.optable import resolve_ops

    table = resolve_ops("hyspec.cpu_ops", "cpu_op_overrides", source="cpu_ops").table
    if table.sources["attention"] == "reference":
        pytest.skip("the CPU attention kernel is not built here")
    return table


@pytest.mark.parametrize("ops", ["reference", "cpu"])
def test_soft_capped_tree_verification_past_the_window_equals_each_path_alone(gemma2_dir, ops):
    """Gemma 2 (scores capped at 0.5, every other layer windowed at 8): a verified tree's node gets the logits
    its root-to-node path gets in plain decoding, on a context past the window."""
    model = load_model(gemma2_dir, dtype="float32", ops=reference_ops() if ops == "reference" else _cpu_ops())
    pool, layout, runner = make_runner(model, pages=64, block_size=4)
    g = torch.Generator().manual_seed(0)
    parents = [-1, 0, 0, 1, 3, 2, 4, 6, 7, 5]
    kv = SequenceKV(pool, layout)
    ctx = torch.randint(3, 128, (14,), generator=g).tolist()
    toks = torch.randint(3, 128, (len(parents),), generator=g).tolist()
    kv.reserve(len(ctx) + len(parents))
    runner.run([Feed(kv, ctx, 0, logits=LAST_LOGITS)])
    depths = [len(path_to(parents, i)) - 1 for i in range(len(parents))]
    out = runner.run([Feed(kv, toks, len(ctx), depths=depths, tree_mask=ancestor_mask(parents), logits=ALL_LOGITS)])
    for i in range(len(parents)):
        solo = SequenceKV(pool, layout)
        path = [toks[j] for j in path_to(parents, i)]
        solo.reserve(len(ctx) + len(path))
        ref = runner.run([Feed(solo, ctx + path, 0, logits=LAST_LOGITS)]).logits[0]
        torch.testing.assert_close(out.feed_logits(0)[i], ref, atol=1e-5, rtol=1e-5)
        solo.release()
    kv.release()
    pool.assert_all_free()


def test_speculation_on_gemma2_returns_plain_decodings_tokens(tmp_path):
    """ngram chains and random trees (the oracle proposer) at temperature 0 on the CPU backend, 40 tokens past
    an 8-token window, scores and logits soft-capped at Gemma 2's published 50 / 30 (every method on Gemma 2,
    Gemma 3 and Phi-3: docs/results/2026-12-06/architectures/, and the slow test below)."""
    from hyspec import LLM, SamplingParams
    from tests.spec.oracle_tree import OracleTreeProposer

    from tests.model.hf_fixtures import FAMILIES

    cls, kwargs = FAMILIES["gemma2"]
    FAMILIES["gemma2_published_caps"] = (cls, {**kwargs, "attn_logit_softcapping": 50.0,
                                               "final_logit_softcapping": 30.0, "initializer_range": 0.08})
    try:
        make_hf_model("gemma2_published_caps", tmp_path, layers=2, seed=6)
    finally:
        del FAMILIES["gemma2_published_caps"]
    prompts = [[5, 9, 17, 5, 9, 17, 33, 40, 5, 9], [60, 61, 62], [7] * 12]
    greedy = SamplingParams(temperature=0, max_tokens=40)
    args = dict(dtype="float32", backend="cpu", kv_cache_bytes=8 << 20, skip_tokenizer_init=True)
    fast = {"controller": {"enabled": False, "profile_at_startup": False}}

    def run(spec=None, proposer=None):
        with LLM(str(tmp_path), speculative_config=None if spec is None else {**fast, **spec}, **args) as llm:
            if proposer is not None:
                llm.engine.spec.proposers["ngram"] = proposer
            tokens = [o.outputs[0].token_ids for o in llm.generate(prompts, greedy)]
            if spec is not None:
                assert llm.engine.spec.metrics.snapshot()["totals"]["accepted_tokens"] > 0  # it speculated
            return tokens

    plain = run()
    assert run({"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1,
                "prompt_lookup_max": 3}) == plain
    refs = {tuple(p): out for p, out in zip(prompts, plain)}
    assert run({"method": "ngram", "num_speculative_tokens": 8}, OracleTreeProposer(refs, 128, seed=1)) == plain


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["gemma2", "gemma3_text", "phi3", "phi3_longrope"])
def test_every_method_is_token_identical_to_plain_decoding(arch, tmp_path):
    """hyspec's conformance check for every method it lists (random drafters built for the target), on the CPU
    backend: batch 1 and a ragged batch equal plain decoding, near-tie rate, KV pool clean (~1 min each)."""
    from hyspec.conformance.methods import MethodSettings, check_method, check_plain, methods_to_check
    from hyspec.conformance.targets import resolve

    from tests.model.hf_fixtures import identity_workspace, make_identity_target

    target = resolve("cpu")[0]
    ws = identity_workspace(tmp_path / "ws", make_identity_target(arch, tmp_path / "target"))
    settings = MethodSettings()
    results = [check_plain(target, ws, settings)] + [check_method(target, ws, m, settings) for m in methods_to_check()]
    failed = [(r.name, r.status, r.detail) for r in results
              if r.status != "pass" and not (r.status == "skip" and "not in this build" in r.detail)]
    assert not failed, failed
