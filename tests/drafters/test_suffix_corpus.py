"""suffix_decoding_corpus: the corpus file, its checks against the target's vocabulary, the third source of
drafts (read-only, never evicted), identity with plain decoding, and the corpus shipped for the default model."""
from __future__ import annotations

import json

import pytest

from hyspec.drafters.suffix.corpus import (MANIFEST_FILE, TENSORS_FILE, default_corpus_dir, load_corpus, save_corpus,
                                          vocab_sha256)
from hyspec.drafters.suffix.proposer import CORPUS, OWN, SuffixProposer, SuffixSettings
from hyspec.errors import CheckpointError, ConfigError
from hyspec.spec.config import SpeculativeConfig

from tests.drafters.test_suffix import tiny  # noqa: F401 (the tiny target fixture)
from tests.model.test_default_model import needs_default


class _Vocab:
    """The part of a tokenizer a corpus reads: its vocabulary."""

    def __init__(self, n: int, salt: str = ""):
        self.vocab = {f"t{salt}{i}": i for i in range(n)}

    def get_vocab(self) -> dict[str, int]:
        return dict(self.vocab)


class _Seq:
    def __init__(self, rid: str, prompt: list[int], output: list[int]):
        self.request_id, self.token_ids, self.output_token_ids = rid, prompt + output, output
        self.last_token = self.token_ids[-1]


SEQS = [[1, 2, 3, 4, 5, 6, 7, 8], [9, 9, 2, 3, 4, 5, 6, 10], [300]]


def test_a_corpus_round_trips_with_its_vocabulary_and_recipe(tmp_path):
    vocab = _Vocab(400)  # > 255: stored as uint16
    save_corpus(tmp_path, SEQS, vocab, {"built_by": "this test"})
    manifest = json.loads((tmp_path / MANIFEST_FILE).read_text())
    assert (manifest["vocab_size"], manifest["sequences"], manifest["tokens"]) == (400, 3, 17)
    assert manifest["vocab_sha256"] == vocab_sha256(vocab) and manifest["recipe"] == {"built_by": "this test"}
    corpus = load_corpus(tmp_path, vocab, 400)
    assert corpus.sequences == SEQS and corpus.num_tokens == 17


def test_a_corpus_for_another_vocabulary_is_refused_naming_both(tmp_path):
    save_corpus(tmp_path, SEQS, _Vocab(400), {})
    with pytest.raises(CheckpointError, match=r"another vocabulary: its 400 tokens .* the target's 400") as err:
        load_corpus(tmp_path, _Vocab(400, salt="x"), 400)  # same size, other tokens
    assert str(tmp_path) in str(err.value)
    with pytest.raises(CheckpointError, match="vocabulary of 400 tokens; the target has 100"):
        load_corpus(tmp_path, None, 100)  # a remote worker: sizes only
    with pytest.raises(CheckpointError, match="another vocabulary"):  # the shipped one is not for this target
        load_corpus(default_corpus_dir(), _Vocab(400, salt="x"), 400)


def test_bad_corpus_files_are_named(tmp_path):
    with pytest.raises(CheckpointError, match=f"expected {MANIFEST_FILE} and {TENSORS_FILE}"):
        load_corpus(tmp_path / "missing")
    save_corpus(tmp_path, SEQS, _Vocab(400), {})
    manifest = json.loads((tmp_path / MANIFEST_FILE).read_text())
    (tmp_path / MANIFEST_FILE).write_text("{not json")
    with pytest.raises(CheckpointError, match="unreadable manifest"):
        load_corpus(tmp_path)
    (tmp_path / MANIFEST_FILE).write_text(json.dumps({**manifest, "format": 99}))
    with pytest.raises(CheckpointError, match="format 99"):
        load_corpus(tmp_path)
    (tmp_path / MANIFEST_FILE).write_text(json.dumps(manifest))
    (tmp_path / TENSORS_FILE).write_bytes(b"garbage")
    with pytest.raises(CheckpointError, match="unreadable"):
        load_corpus(tmp_path)
    import torch
    from safetensors.torch import save_file

    save_file({"tokens": torch.tensor([1, 2, 3], dtype=torch.int32), "offsets": torch.tensor([0, 5])},
              str(tmp_path / TENSORS_FILE))
    with pytest.raises(CheckpointError, match="offsets do not cut its 3 tokens"):
        load_corpus(tmp_path)
    save_file({"tokens": torch.tensor([1, 2, 999], dtype=torch.int32), "offsets": torch.tensor([0, 3])},
              str(tmp_path / TENSORS_FILE))
    with pytest.raises(CheckpointError, match="outside its vocabulary of 400"):
        load_corpus(tmp_path)


def test_the_corpus_drafts_when_nothing_nearer_does_and_is_never_forgotten():
    prop = SuffixProposer(SuffixSettings(max_tree_depth=12, max_cached_requests=2), max_tokens=8,
                          vocab_size=400, corpus=SEQS)
    seq = _Seq("a", [50, 2, 3, 4], [])
    own = prop.draft(prop._own_store(seq), seq.token_ids, 8, exclude_end=(0, 3))
    assert own.tokens == []  # nothing to copy from the request itself
    shipped = prop.draft(prop.corpus, seq.token_ids, 8)
    assert shipped.tokens[:2] == [5, 6] and shipped.match_length == 3  # both corpus sequences continue "2 3 4" with 5 6
    assert prop.match_length(seq, cap=16) == 3
    # through propose: the corpus's tree drafts and is counted as such
    from hyspec.seam.proposer import DraftRequest

    tree = prop.propose([DraftRequest(seq=seq, budget=8)], sampling=None)[0]
    assert tree is not None and tree.scores.source == CORPUS and prop.stats["drafts_corpus"] == 1
    # the request's own tokens win a tie
    seq2 = _Seq("b", [2, 3, 4, 5, 6, 7, 2, 3, 4], [])
    tree2 = prop.propose([DraftRequest(seq=seq2, budget=8)], sampling=None)[0]
    assert tree2.scores.source == OWN
    # the cache fills and evicts; the corpus stays, also through forget_shared_history
    for i in range(10):
        prop.on_finish(_Seq(f"r{i}", [1], [100 + i, 101 + i, 102 + i]))
    prop.forget_shared_history()
    assert len(prop.cache) == 0 and len(prop.corpus) == len(SEQS)
    assert prop.memory_bytes() >= prop.corpus.memory_bytes() > 0


def test_corpus_tokens_outside_the_vocabulary_are_refused():
    with pytest.raises(ValueError, match="sequence 2: a token id outside the target's vocabulary of 100"):
        SuffixProposer(SuffixSettings(), max_tokens=8, vocab_size=100, corpus=SEQS)


def test_the_config_key():
    assert SpeculativeConfig.from_dict({"method": "suffix"}).suffix_decoding_corpus is None
    assert SpeculativeConfig.from_dict({"method": "suffix", "suffix_decoding_corpus": "none"}).suffix_decoding_corpus \
        == "none"
    for bad in ("", 3):
        with pytest.raises(ConfigError, match="speculative_config.suffix_decoding_corpus"):
            SpeculativeConfig.from_dict({"method": "suffix", "suffix_decoding_corpus": bad})


# -- the engine ----------------------------------------------------------------------------------------

PROMPTS = ["def add(a, b):", "class Foo:\n    def", "import os\n", "x = 1\n"]


def test_greedy_identical_to_plain_with_a_corpus_of_the_targets_answers(tiny, tmp_path):
    """A corpus holding the target's answers to these prompts drafts them from the first request (the cache
    is empty); the output is plain decoding's.  A corpus for another vocabulary is a config error."""
    from hyspec import LLM, SamplingParams
    from hyspec.model.tokenizer import Tokenizer

    greedy = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
    plain = LLM(str(tiny), dtype="float32", kv_cache_bytes=8 << 20)
    outs = plain.generate(PROMPTS, greedy)
    expected = [o.outputs[0].token_ids for o in outs]
    save_corpus(tmp_path / "corpus", [list(o.prompt_token_ids) + list(o.outputs[0].token_ids) for o in outs],
                Tokenizer(tiny), {"built_by": "this test"}, vocab_size=plain.engine.target.vocab_size)
    spec = {"method": "suffix", "suffix_decoding_corpus": str(tmp_path / "corpus"),
            "suffix_decoding_max_cached_requests": 0,
            "controller": {"enabled": False, "profile_at_startup": False}}
    llm = LLM(str(tiny), dtype="float32", kv_cache_bytes=8 << 20, speculative_config=spec)
    assert [o.outputs[0].token_ids for o in llm.generate(PROMPTS, greedy)] == expected
    prop = llm.engine.spec.proposers["suffix"]
    totals = llm.engine.spec.metrics.snapshot()["totals"]
    assert prop.stats["drafts_corpus"] > 0 and totals["accepted_tokens"] > len(PROMPTS) * 8
    llm.engine.pool.assert_all_free()
    llm.close()
    save_corpus(tmp_path / "other", [[1, 2, 3]], _Vocab(50), {})
    with pytest.raises(ConfigError, match="suffix_decoding_corpus.*another vocabulary"):
        LLM(str(tiny), dtype="float32", kv_cache_bytes=8 << 20,
            speculative_config={**spec, "suffix_decoding_corpus": str(tmp_path / "other")})


@needs_default
def test_the_default_models_corpus_is_opt_in_and_built_for_it():
    """Off unless asked for ("default"): on the 2-core CPU it raised tokens per step, not speed."""
    from hyspec import LLM, SamplingParams
    from hyspec.assets import default_model
    from hyspec.model.tokenizer import Tokenizer

    corpus = load_corpus(default_corpus_dir(), Tokenizer(default_model()), 49152)
    assert corpus.num_tokens > 100_000
    assert "HumanEval" not in json.dumps(corpus.manifest["recipe"]["prompts"])  # never built from the benchmark
    prompts, greedy = ["def is_palindrome(s):"], SamplingParams(temperature=0, max_tokens=24)
    base = {"method": "suffix", "controller": {"enabled": False, "profile_at_startup": False}}
    got = {}
    for setting in (None, "default"):
        llm = LLM(kv_cache_bytes=64 << 20, max_model_len=512,
                  speculative_config={**base, "suffix_decoding_corpus": setting})
        prop = llm.engine.spec.proposers["suffix"]
        assert (prop.corpus is not None) == (setting == "default")
        got[setting] = llm.generate(prompts, greedy)[0].outputs[0].token_ids
        llm.close()
    assert got[None] == got["default"]
