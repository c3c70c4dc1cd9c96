"""Temperature 0 on a mixture-of-experts GGUF target (Qwen2-MoE in Q8_0, as llama.cpp writes it): every
speculative method returns plain decoding's tokens.  The CPU backend computes the attention linears and the
routed and shared experts with the file's Q8_0 blocks (hyspec.model.quantize_model, hyspec.model.moe_stored).

Default tier, as tests/model/test_moe_identity.py does for the safetensors checkpoint: prompt lookup, a
separate draft model, the target drafting for itself (every draft accepted) and random trees around the
greedy continuation (deep acceptances, so the routed blocks verify tree-shaped batches)."""
from __future__ import annotations

import pytest
from hyspec import LLM

from tests.model.gguf_moe_fixtures import write_moe_gguf
from tests.model.moe_fixtures import make_moe_checkpoint
from tests.model.test_moe_identity import BATCH, FAST, GREEDY, _generate
from tests.spec.oracle_tree import OracleTreeProposer


@pytest.fixture(scope="module")
def moe_gguf(tmp_path_factory):
    root = tmp_path_factory.mktemp("moe_gguf")
    make_moe_checkpoint(root / "src", "qwen2_moe_a", seed=3, intermediate_size=96, moe_intermediate_size=32,
                        shared_expert_intermediate_size=64)
    return write_moe_gguf(root / "src", root / "qwen2moe-q8_0.gguf", "Q8_0")


@pytest.fixture(scope="module")
def plain(moe_gguf):
    llm = LLM(str(moe_gguf), dtype="float32", kv_cache_bytes=8 << 20)
    report = llm.engine.model.quantization
    assert report.linears.get("int8 (Q8_0)") == 2 * 2, report.summary()
    # 2 layers x (4 experts + the shared one) x (gate|up, down)
    assert report.linears.get("expert int8 (Q8_0)") == 2 * 5 * 2, report.summary()
    return [o.outputs[0].token_ids for o in llm.generate(BATCH, GREEDY)]


def test_prompt_lookup_identical_to_plain(moe_gguf, plain):
    llm, out = _generate(moe_gguf, {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1,
                                    "prompt_lookup_max": 3})
    assert out == plain
    assert llm.engine.spec.metrics.snapshot()["totals"]["draft_tokens"] > 0
    llm.engine.pool.assert_all_free()


def test_draft_model_identical_to_plain(moe_gguf, plain, tmp_path):
    from tests.model.tiny_checkpoint import make_checkpoint

    make_checkpoint(tmp_path, "llama_gqa", layers=1, seed=7)
    llm, out = _generate(moe_gguf, {"method": "draft_model", "model": str(tmp_path), "num_speculative_tokens": 3})
    assert out == plain
    assert llm.engine.spec.metrics.snapshot()["totals"]["draft_tokens"] > 0


def test_self_draft_accepts_everything(moe_gguf, plain):
    llm, out = _generate(moe_gguf, {"method": "draft_model", "model": str(moe_gguf), "num_speculative_tokens": 4})
    assert out == plain
    t = llm.engine.spec.metrics.snapshot()["totals"]
    assert t["draft_tokens"] > 0 and t["accepted_tokens"] == t["draft_tokens"]


def test_random_trees_identical_to_plain(moe_gguf, plain):
    llm = LLM(str(moe_gguf), dtype="float32", kv_cache_bytes=8 << 20,
              speculative_config={**FAST, "method": "ngram", "num_speculative_tokens": 8})
    refs = {tuple(llm.tokenizer.encode(p)): out for p, out in zip(BATCH, plain)}
    llm.engine.spec.proposers["ngram"] = OracleTreeProposer(refs, llm.engine.config.vocab_size, seed=1)
    assert [o.outputs[0].token_ids for o in llm.generate(BATCH, GREEDY)] == plain
    assert llm.engine.spec.metrics.snapshot()["totals"]["accepted_per_position"][2] > 0


@pytest.mark.slow
def test_every_method_identical_to_plain(tmp_path):
    """hyspec's conformance check for every method it lists (random drafters built for the target), CPU backend,
    on a Q8_0 Qwen2-MoE GGUF: batch 1 and a ragged batch equal plain decoding, near-tie rate, KV pool clean.
    The prompts are the conformance byte-id prompts; the file's vocabulary is the tiny BPE one (a GGUF's gpt2
    vocabulary needs merges, which the conformance byte tokenizer has none of)."""
    from hyspec.conformance.methods import (
        MethodSettings,
        check_method,
        check_plain,
        methods_to_check,
    )
    from hyspec.conformance.targets import resolve

    from tests.model.hf_fixtures import identity_workspace
    from tests.model.moe_fixtures import make_moe_checkpoint

    src = tmp_path / "src"
    make_moe_checkpoint(src, "qwen2_moe_a", seed=7, initializer_range=0.08, intermediate_size=96,
                        moe_intermediate_size=32, shared_expert_intermediate_size=64)
    target = write_moe_gguf(src, tmp_path / "qwen2moe-q8_0.gguf", "Q8_0")
    ws = identity_workspace(tmp_path / "ws", target)
    settings = MethodSettings()
    backend = resolve("cpu")[0]
    results = [check_plain(backend, ws, settings)] + [check_method(backend, ws, m, settings)
                                                      for m in methods_to_check()]
    failed = [(r.name, r.status, r.detail) for r in results
              if r.status != "pass" and not (r.status == "skip" and "not in this build" in r.detail)]
    assert not failed, failed
