"""suffix: the token stores, the frequency-scored trees, vLLM's keys, a bounded cache, identity with plain decoding."""
from __future__ import annotations

import pytest

from hyspec.drafters.suffix.proposer import SuffixProposer, SuffixSettings, grow_tree
from hyspec.drafters.suffix.store import ENTRY_BYTES, QGRAM, TOKEN_BYTES, TokenStore
from hyspec.errors import ConfigError
from hyspec.spec.config import SpeculativeConfig

# -- the store -----------------------------------------------------------------------------------------


def test_longest_match_finds_the_longest_suffix_followed_by_something():
    store = TokenStore()
    store.extend(0, [5, 1, 2, 3, 9, 7, 2, 3, 8])
    m = store.longest_match([4, 1, 2, 3], max_length=10)
    assert (m.length, m.ends) == (3, [(0, 3)])  # "1 2 3" once; "2 3" twice, but shorter
    assert store.continuations(m.ends, 2) == [[9, 7]]
    m = store.longest_match([6, 2, 3], max_length=10)
    assert m.length == 2 and sorted(m.ends) == [(0, 3), (0, 7)]
    assert store.longest_match([2, 3], max_length=1).length == 1  # capped
    assert store.longest_match([42], max_length=5).length == 0


def test_the_contexts_own_end_is_not_a_match():
    store = TokenStore()
    tokens = [1, 2, 3, 1, 2, 3]
    store.extend(0, tokens)
    m = store.longest_match(tokens, max_length=10, exclude_end=(0, len(tokens) - 1))
    assert m.length == 3 and m.ends == [(0, 2)]  # the earlier "1 2 3", followed by 1
    assert store.continuations(m.ends, 5) == [[1, 2, 3]]


def test_each_key_keeps_its_newest_occurrences():
    store = TokenStore(max_per_key=3)
    store.extend(0, [7, 1] * 10)
    m = store.longest_match([7], max_length=1)
    assert [pos for _, pos in m.ends] == [14, 16, 18]  # the three newest 7s (all followed by a 1)


def test_fifo_eviction_removes_every_trace_of_the_oldest_sequence():
    store = TokenStore()
    store.extend(0, [1, 2, 3, 4, 5])
    store.extend(1, [1, 2, 3, 4, 6])
    assert store.evict_oldest() == 0
    m = store.longest_match([9, 1, 2, 3, 4], max_length=10)
    assert m.ends == [(1, 3)] and store.continuations(m.ends, 1) == [[6]]
    assert store.evict_oldest() == 1 and store.evict_oldest() is None
    assert store.num_tokens == 0 and store.num_entries == 0 and not store._index


# -- trees ---------------------------------------------------------------------------------------------


def test_a_tree_takes_the_most_frequent_continuations_first():
    conts = [[1, 2, 3], [1, 2, 4], [1, 5], [6]]  # 1: 3/4, 1-2: 2/4, 1-2-3: 1/4, 1-2-4: 1/4, 1-5: 1/4, 6: 1/4
    draft = grow_tree(conts, budget=3, min_prob=0.0)
    assert draft.tokens[:2] == [1, 2] and draft.parents[:2] == [0, 1]
    assert draft.score == pytest.approx(0.75 + 0.5 + 0.25)
    assert grow_tree(conts, budget=10, min_prob=0.3).tokens == [1, 2]  # 1/4 < 0.3 is left out
    full = grow_tree(conts, budget=10, min_prob=0.0)
    assert sorted(full.tokens) == [1, 2, 3, 4, 5, 6]
    assert all(p < i + 1 for i, p in enumerate(full.parents))  # parents come first


def test_speculation_depth_follows_the_match_length_and_the_tree_depth():
    prop = SuffixProposer(SuffixSettings(max_tree_depth=6, max_spec_factor=1.0, min_token_prob=0.0,
                                         max_cached_requests=0), max_tokens=32, vocab_size=100)
    store = TokenStore()
    store.extend(0, [9, 8, 1, 2, 3, 4, 5, 6, 7, 50, 51, 52, 53, 54, 55, 56, 57])
    # match of 1 token ("3"): factor 1.0 -> one token
    assert prop.draft(store, [60, 3], budget=32).tokens == [4]
    # match of 3 tokens ("1 2 3"): three tokens, and 3 + 3 <= max_tree_depth 6
    assert prop.draft(store, [70, 1, 2, 3], budget=32).tokens == [4, 5, 6]
    # match of 5 tokens (capped at max_tree_depth - 1) allows 6 - 5 = 1 token; the balanced length
    # 6 / (1 + 1.0) = 3 ("1 2 3", the same occurrence) allows three, and its tree scores higher
    assert prop.draft(store, [9, 8, 1, 2, 3], budget=32).tokens == [4, 5, 6]
    factor = SuffixProposer(SuffixSettings(max_tree_depth=24, max_spec_factor=2.0, min_token_prob=0.0,
                                           max_cached_requests=0), max_tokens=32, vocab_size=100)
    assert factor.draft(store, [70, 2, 3], budget=32).tokens == [4, 5, 6, 7]  # 2 x 2
    assert factor.draft(store, [70, 2, 3], budget=2).tokens == [4, 5]  # the step's budget
    # the balanced length loses when its suffix is ambiguous: "8 1 2 3" also ends four other responses, each
    # going its own way (1/5 each, under min_token_prob), so the longest match's one sure token wins
    strict = SuffixProposer(SuffixSettings(max_tree_depth=6, max_spec_factor=1.0, min_token_prob=0.3,
                                           max_cached_requests=0), max_tokens=32, vocab_size=100)
    for serial, last in enumerate((90, 91, 92, 93), start=1):
        store.extend(serial, [8, 1, 2, 3, last])
    assert strict.draft(store, [9, 8, 1, 2, 3], budget=32).tokens == [4]
    assert strict.draft(store, [70, 1, 2, 3], budget=32).tokens == []


class _Seq:
    def __init__(self, rid, prompt, output):
        self.request_id, self.token_ids, self.output_token_ids = rid, prompt + output, output


def test_the_global_cache_is_bounded_and_evicts_the_oldest():
    """Filled far past suffix_decoding_max_cached_requests: the count and the memory stay bounded."""
    import random

    limit, length = 50, 40
    rng = random.Random(0)
    responses = [[rng.randrange(100_000) for _ in range(length)] for _ in range(20 * limit)]
    prop = SuffixProposer(SuffixSettings(max_cached_requests=limit), max_tokens=8, vocab_size=100_000)
    for i, response in enumerate(responses):
        prop.on_finish(_Seq(str(i), [1, 2], response))
    assert len(prop.cache) == limit and prop.stats["evicted_responses"] == 19 * limit
    assert prop.cache.num_tokens == limit * length
    assert prop.cache.num_entries <= 2 * limit * length  # a 1-gram and a 4-gram entry per token at most
    assert prop.memory_bytes() <= limit * length * (TOKEN_BYTES + 2 * ENTRY_BYTES)
    newest, first = responses[-1], responses[0]
    m = prop.cache.longest_match(newest[:QGRAM + 1], max_length=10)
    assert m.length == QGRAM + 1 and prop.cache.continuations(m.ends, 1) == [[newest[QGRAM + 1]]]
    assert prop.cache.longest_match(first[:QGRAM + 1], max_length=10).length < QGRAM  # the first one is gone


def test_no_global_cache_when_max_cached_requests_is_zero():
    prop = SuffixProposer(SuffixSettings(max_cached_requests=0), max_tokens=8, vocab_size=100)
    prop.on_finish(_Seq("a", [1], [2, 3, 4]))
    assert len(prop.cache) == 0 and prop.memory_bytes() == 0


def test_match_length_looks_in_the_requests_own_tokens_and_in_earlier_responses():
    """The hybrid's match_length signal: the own tokens (never the context's own end), then the cache, capped."""
    prop = SuffixProposer(SuffixSettings(max_tree_depth=8), max_tokens=8, vocab_size=100)
    assert prop.match_length(_Seq("a", [1, 2, 3, 4], []), cap=16) == 0  # "4" occurs only at the end
    assert prop.match_length(_Seq("b", [1, 2, 3, 9, 1, 2, 3], []), cap=16) == 3
    assert prop.match_length(_Seq("c", [1, 2, 3, 9, 1, 2, 3], []), cap=2) == 2  # the cap
    prop.on_finish(_Seq("old", [0], [20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30]))
    # the cache holds a longer copy than the own tokens; the tree depth (8) caps it at 7
    assert prop.match_length(_Seq("d", [5, 21, 22, 23, 24, 25, 26, 27, 28], []), cap=16) == 7
    assert prop.match_length(_Seq("e", [5, 21, 22, 23], []), cap=16) == 3
    off = SuffixProposer(SuffixSettings(max_cached_requests=0), max_tokens=8, vocab_size=100)
    off.on_finish(_Seq("old", [0], [20, 21, 22, 23]))
    assert off.match_length(_Seq("f", [5, 21, 22, 23], []), cap=16) == 0


# -- config --------------------------------------------------------------------------------------------


def test_vllms_keys_and_defaults():
    cfg = SpeculativeConfig.from_dict({"method": "suffix"})
    assert (cfg.suffix_decoding_max_tree_depth, cfg.suffix_decoding_max_cached_requests,
            cfg.suffix_decoding_max_spec_factor, cfg.suffix_decoding_min_token_prob) == (24, 10000, 1.0, 0.1)
    assert cfg.num_speculative_tokens == 24  # vLLM: the tree depth, for suffix
    assert SpeculativeConfig.from_dict({"method": "suffix", "num_speculative_tokens": 8}).num_speculative_tokens == 8


@pytest.mark.parametrize("key, value, message", [
    ("suffix_decoding_max_tree_depth", 1, ">= 2"),
    ("suffix_decoding_max_tree_depth", 1000, "<= 256"),
    ("suffix_decoding_max_cached_requests", -1, ">= 0"),
    ("suffix_decoding_max_spec_factor", 0, "> 0"),
    ("suffix_decoding_min_token_prob", 1.5, "<= 1"),
    ("suffix_decoding_min_token_prob", "high", "finite number"),
])
def test_out_of_range_keys_are_named(key, value, message):
    with pytest.raises(ConfigError) as err:
        SpeculativeConfig.from_dict({"method": "suffix", key: value})
    assert f"speculative_config.{key}" in str(err.value) and message in str(err.value), str(err.value)


def test_an_unknown_suffix_key_is_named_with_the_closest_one():
    with pytest.raises(ConfigError, match="suffix_decoding_min_token_prob"):
        SpeculativeConfig.from_dict({"method": "suffix", "suffix_decoding_min_token_probability": 0.2})


# -- the engine ----------------------------------------------------------------------------------------

REPEATED = ["def add(a, b):", "x = [1, 2, 3, 1, 2, 3, 1, 2,", "class Foo:\n    def", "import os\n"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from tests.model.tiny_checkpoint import make_checkpoint

    path = tmp_path_factory.mktemp("suffix_target")
    make_checkpoint(path, "llama_gqa")
    return path


@pytest.mark.parametrize("batch", [1, 4])
def test_greedy_identical_to_plain_and_repeats_draft_from_the_cache(tiny, batch):
    from hyspec import LLM, SamplingParams

    greedy = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    plain = LLM(str(tiny), dtype="float32", kv_cache_bytes=8 << 20)
    expected = [o.outputs[0].token_ids for o in plain.generate(REPEATED, greedy)]
    llm = LLM(str(tiny), dtype="float32", kv_cache_bytes=8 << 20, speculative_config={
        "method": "suffix", "controller": {"enabled": False, "profile_at_startup": False}})
    for _ in range(2):  # the second round finds the first round's responses in the global cache
        got = []
        for i in range(0, len(REPEATED), batch):
            got += [o.outputs[0].token_ids for o in llm.generate(REPEATED[i:i + batch], greedy)]
        assert got == expected
    prop = llm.engine.spec.proposers["suffix"]
    totals = llm.engine.spec.metrics.snapshot()["totals"]
    assert prop.stats["drafts_cache"] > 0 and totals["accepted_tokens"] > 0
    assert len(prop.cache) == 2 * len(REPEATED) and not prop._own  # every request's own store released
    llm.engine.pool.assert_all_free()
