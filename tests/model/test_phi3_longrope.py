"""Phi-3 with longrope (the 128k variants' RoPE): one factor set per model, fixed by the context it serves.

transformers picks the set per forward from the longest position in the batch; hyspec picks it once from the
served context (llama.cpp's and vLLM 0.32's rule: hyspec.model.rope).  The logits are compared with
transformers where both pick the same set: a model serving at most ``original_max_position_embeddings`` (32
here) on sequences that fit in it (short set), and a model serving more on sequences longer than it (long set).
"""
from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
from hyspec.errors import CheckpointError
from hyspec.kv.sequence_kv import SequenceKV
from hyspec.model.config import ModelConfig
from hyspec.model.loader import load_model
from hyspec.model.rope import cos_sin_cache, inverse_frequencies, uses_long_factors
from hyspec.seam.forward import LAST_LOGITS, Feed

from tests.model.gguf_fixtures import write_gguf
from tests.model.hf_fixtures import LONGROPE_FAMILIES, make_hf_model
from tests.model.paged_decode import greedy_paged, make_runner
from tests.model.tiny_checkpoint import VOCAB, write_tokenizer

ORIGINAL = 32  # the family's original_max_position_embeddings (of 128)
SHORT, LONG = LONGROPE_FAMILIES["phi3_longrope"][1]["rope_parameters"]["short_factor"], \
    LONGROPE_FAMILIES["phi3_longrope"][1]["rope_parameters"]["long_factor"]
#: (regime, served context, prompt length, decode steps): the short regime's sequence stays within 32 positions,
#: the long regime's prompt is already past them, so transformers uses one set throughout each
REGIMES = {"short": (ORIGINAL, 8, 23), "long": (128, 40, 24)}
#: fp32 on CPU, the same maths in another op order (fused qkv / gate_up, paged gather): rounding-level differences
ATOL = 1e-5


@pytest.fixture(scope="module")
def phi3_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("phi3_longrope")
    hf = make_hf_model("phi3_longrope", path, seed=4)
    return path, hf


@pytest.mark.parametrize("regime", sorted(REGIMES))
def test_logits_and_greedy_tokens_match_transformers_where_both_use_the_same_factors(regime, phi3_dir):
    path, hf = phi3_dir
    context, prompt_len, steps = REGIMES[regime]
    model = load_model(path, dtype="float32", max_positions=context)
    assert uses_long_factors(model.config.rope, model.max_positions) == (regime == "long")
    prompt = torch.randint(3, 128, (prompt_len,), generator=torch.Generator().manual_seed(1)).tolist()
    tokens, logits = greedy_paged(model, prompt, steps=steps, block_size=16)
    full = torch.tensor([prompt + tokens[:-1]])
    with torch.no_grad():
        ref = hf(full).logits[0, prompt_len - 1:].float()
        dense = model.compute_logits(model.forward_dense(full).hidden)[0, prompt_len - 1:]
        gen = hf.generate(torch.tensor([prompt]), max_new_tokens=steps + 1, do_sample=False,
                          eos_token_id=None, pad_token_id=0)
    torch.testing.assert_close(logits, ref, atol=ATOL, rtol=ATOL)
    torch.testing.assert_close(dense, ref, atol=ATOL, rtol=ATOL)
    assert tokens == gen[0, prompt_len:].tolist()


def test_the_served_context_fixes_the_factor_set_and_the_attention_factor(phi3_dir):
    """Long above the original context, for every position; the engine's max_model_len decides, not the table's
    length (which has room for draft positions past it); the attention factor is the LongRoPE paper's in both."""
    cfg = ModelConfig.from_pretrained(phi3_dir[0])
    assert (cfg.rope.rope_type, cfg.rope.original_max_position_embeddings, cfg.rope.factor) == ("longrope", 32, 4.0)
    exponents = torch.arange(0, 16, 2).float() / 16
    expected_scale = math.sqrt(1 + math.log(4.0) / math.log(32))
    for context, factors in ((32, SHORT), (33, LONG), (128, LONG)):
        inv_freq, scale = inverse_frequencies(cfg.for_context(context).rope, 16, 128, max_positions=200)
        torch.testing.assert_close(inv_freq, 1.0 / (torch.tensor(factors) * 10000.0 ** exponents), rtol=0, atol=0)
        assert scale == pytest.approx(expected_scale, rel=1e-12)
    engine_like = load_model(phi3_dir[0], dtype="float32", max_positions=ORIGINAL + 64, context_length=ORIGINAL)
    short_only = load_model(phi3_dir[0], dtype="float32", max_positions=ORIGINAL)
    torch.testing.assert_close(engine_like.cos_sin[:ORIGINAL], short_only.cos_sin, rtol=0, atol=0)


def test_a_sequences_logits_do_not_depend_on_its_batch(phi3_dir):
    """Where transformers would rotate a short prompt with the long set once a long one joins its batch, hyspec's
    short prompt gets the same logits alone and beside a prompt past the original context."""
    model = load_model(phi3_dir[0], dtype="float32")
    pool, layout, runner = make_runner(model, pages=32, block_size=16)
    g = torch.Generator().manual_seed(3)
    short, long = torch.randint(3, 128, (10,), generator=g).tolist(), torch.randint(3, 128, (50,), generator=g).tolist()

    def run(prompts):
        kvs = [SequenceKV(pool, layout) for _ in prompts]
        for kv, p in zip(kvs, prompts):
            kv.reserve(len(p))
        out = runner.run([Feed(kv, p, 0, logits=LAST_LOGITS) for kv, p in zip(kvs, prompts)]).logits
        for kv in kvs:
            kv.release()
        return out

    torch.testing.assert_close(run([short, long])[0], run([short])[0], rtol=0, atol=1e-6)
    pool.assert_all_free()


PHI3_128K = {  # microsoft/Phi-3-mini-128k-instruct's config.json keys (transformers 4 spelling; sizes shrunk)
    "model_type": "phi3", "architectures": ["Phi3ForCausalLM"], "vocab_size": 128, "hidden_size": 64,
    "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4,
    "hidden_act": "silu", "max_position_embeddings": 131072, "original_max_position_embeddings": 4096,
    "rope_theta": 10000.0, "sliding_window": 262144, "tie_word_embeddings": False,
    "rope_scaling": {"type": "longrope", "short_factor": SHORT, "long_factor": LONG}}


def test_configs_as_published_read_as_transformers_reads_them():
    cfg = ModelConfig.from_dict(PHI3_128K)
    rope = cfg.rope
    assert (rope.rope_type, rope.original_max_position_embeddings, rope.factor) == ("longrope", 4096, 32.0)
    assert (rope.short_factor, rope.long_factor) == (tuple(SHORT), tuple(LONG))
    _, scale = inverse_frequencies(rope, 16, 131072, max_positions=131072)
    assert scale == pytest.approx(math.sqrt(1 + math.log(32) / math.log(4096)))
    su = ModelConfig.from_dict({**PHI3_128K, "rope_scaling": {**PHI3_128K["rope_scaling"], "type": "su"}})
    assert su.rope == rope  # longrope's first name
    # the mscales (vLLM's keys; transformers' Phi-3 ignores them) replace the attention factor in their regime
    scaled = ModelConfig.from_dict({**PHI3_128K, "rope_scaling": {
        **PHI3_128K["rope_scaling"], "short_mscale": 1.1, "long_mscale": 1.3}})
    assert inverse_frequencies(scaled.for_context(4096).rope, 16, 131072, 8192)[1] == 1.1
    assert inverse_frequencies(scaled.for_context(4097).rope, 16, 131072, 8192)[1] == 1.3
    no_top_level = {k: v for k, v in PHI3_128K.items() if k != "original_max_position_embeddings"}
    assert ModelConfig.from_dict(no_top_level).rope.original_max_position_embeddings == 4096  # Phi3Config's default


@pytest.mark.parametrize("change, message", [
    ({"rope_scaling": {"type": "longrope", "short_factor": SHORT}}, "'longrope' needs long_factor"),
    ({"rope_scaling": {"type": "longrope", "short_factor": SHORT, "long_factor": "x"}},
     "long_factor must be a list of numbers"),
    ({"rope_scaling": {"type": "longrope", "short_factor": SHORT, "long_factor": LONG[:4]}},
     "short_factor has 8 entries, long_factor 4"),
    ({"rope_scaling": {"type": "longrope", "short_factor": SHORT, "long_factor": LONG,
                       "original_max_position_embeddings": 8192}},
     "original_max_position_embeddings 8192 disagrees with original_max_position_embeddings 4096"),
    ({"rope_scaling": {"type": "yarn", "factor": 4.0}}, "Phi-3 rope_scaling 'yarn' is not supported"),
    ({"rope_scaling": {"type": "longrope", "short_factor": SHORT, "long_factor": LONG, "attention_factor": 1.2,
                       "short_mscale": 1.1}}, "both attention_factor and short_mscale / long_mscale"),
])
def test_what_is_not_implemented_is_refused_by_name(change, message):
    with pytest.raises(CheckpointError, match=message):
        ModelConfig.from_dict({**PHI3_128K, **change})


def test_factor_lists_of_the_wrong_length_for_the_head_are_refused():
    cfg = ModelConfig.from_dict({**PHI3_128K, "rope_scaling": {
        "type": "longrope", "short_factor": SHORT * 2, "long_factor": LONG * 2}})
    with pytest.raises(CheckpointError, match="short_factor has 16 entries; head_dim 16 needs 8"):
        cos_sin_cache(cfg, 64)


def _gguf_source(path):
    hf = make_hf_model("phi3_longrope", path, vocab_size=VOCAB, intermediate_size=128, seed=3)
    write_tokenizer(path)
    return hf


@pytest.mark.parametrize("qtype", ["F32", "Q8_0"])
def test_gguf_round_trip_gives_the_source_checkpoints_logits_in_both_regimes(qtype, tmp_path):
    """Written as llama.cpp's converter writes it: rope_factors_long / rope_factors_short tensors, the original
    context and the attention factor (computed by the converter, stored as float32) as metadata."""
    src = tmp_path / "src"
    hf = _gguf_source(src)
    gguf_file = write_gguf(src, tmp_path / "phi3-longrope.gguf", qtype, "phi3")
    rope_dir, rope_gguf = ModelConfig.from_pretrained(src).rope, ModelConfig.from_pretrained(gguf_file).rope
    # the factor sets as float32 tensors: the values transformers computes with (torch.tensor(..., float32))
    assert (rope_gguf.short_factor, rope_gguf.long_factor) == (tuple(torch.tensor(SHORT).tolist()),
                                                               tuple(torch.tensor(LONG).tolist()))
    assert replace(rope_gguf, attention_factor=None, short_factor=rope_dir.short_factor,
                   long_factor=rope_dir.long_factor) == rope_dir
    assert rope_gguf.attention_factor == pytest.approx(math.sqrt(1 + math.log(4) / math.log(32)), rel=1e-7)
    ids = torch.arange(3, 318, 5)[None]  # 64 positions, past the original 32
    for context, length in ((ORIGINAL, ORIGINAL), (128, 64)):
        models = [load_model(p, dtype="float32", max_positions=context) for p in (src, gguf_file)]
        with torch.no_grad():
            ref, got = (m.compute_logits(m.forward_dense(ids[:, :length]).hidden)[0] for m in models)
            torch.testing.assert_close(got, ref, atol=ATOL, rtol=ATOL)
            if qtype == "F32":  # and the source is transformers' model
                torch.testing.assert_close(ref, hf(ids[:, :length]).logits[0].float(), atol=ATOL, rtol=ATOL)


def test_a_gguf_with_one_factor_set_is_refused_by_name(tmp_path):
    import gguf

    out = tmp_path / "phi3-half.gguf"
    w = gguf.GGUFWriter(str(out), "phi3")
    w.add_block_count(1)
    w.add_tensor("rope_factors_long.weight", torch.ones(8).numpy())
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(CheckpointError, match="has rope_factors_long but not rope_factors_short"):
        load_model(out)


def test_speculation_on_a_longrope_target_returns_plain_decodings_tokens(tmp_path):
    """ngram chains and random trees (the oracle proposer) at temperature 0 on the CPU backend, the target served
    at max_model_len 128 (long factors) with sequences both sides of the original 32 (every method: the slow
    test_gemma_phi3.py::test_every_method_is_token_identical_to_plain_decoding[phi3_longrope])."""
    from hyspec import LLM, SamplingParams

    from tests.model.hf_fixtures import make_identity_target
    from tests.spec.oracle_tree import OracleTreeProposer

    target = make_identity_target("phi3_longrope", tmp_path)
    prompts = [[5, 9, 17, 5, 9, 17, 33, 40, 5, 9], [60, 61, 62], list(range(40, 80))]
    greedy = SamplingParams(temperature=0, max_tokens=30)
    args = dict(dtype="float32", backend="cpu", kv_cache_bytes=8 << 20, skip_tokenizer_init=True)
    fast = {"controller": {"enabled": False, "profile_at_startup": False}}

    def run(spec=None, proposer=None):
        with LLM(str(target), speculative_config=None if spec is None else {**fast, **spec}, **args) as llm:
            assert uses_long_factors(llm.engine.model.config.rope, llm.engine.model.max_positions)
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
    assert run({"method": "ngram", "num_speculative_tokens": 8}, OracleTreeProposer(refs, VOCAB, seed=1)) == plain


def test_a_drafter_built_for_a_longrope_target_reads_its_rope_as_the_target_does():
    """hyspec's draft-model recipe copies the target's RoPE keys: with the target's head_dim the drafter (a llama
    config) gets longrope with every value resolved (Phi-3's top-level original context included); with another
    head_dim, whose frequencies the factor lists do not describe, plain RoPE at the target's base."""
    from hyspec.train.export import rope_keys

    target = ModelConfig.from_dict(PHI3_128K)
    llama = {"model_type": "llama", "vocab_size": 128, "hidden_size": 64, "intermediate_size": 128,
             "num_hidden_layers": 1, "num_attention_heads": 4, "max_position_embeddings": 131072}
    assert ModelConfig.from_dict({**llama, **rope_keys(target, head_dim=16)}).rope == target.rope
    other = ModelConfig.from_dict({**llama, "num_attention_heads": 2, **rope_keys(target, head_dim=32)}).rope
    assert (other.rope_type, other.theta) == ("default", 10000.0)
