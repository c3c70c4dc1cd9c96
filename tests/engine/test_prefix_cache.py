"""Automatic prefix caching: exact reuse of earlier prompts' full KV pages, bounded by the pool.

The unit half drives PrefixCache over a bare KVPool (chains, exact keys, leaf-first LRU eviction,
reset); the engine half checks that greedy tokens are the same with the cache and without it, for
repeated prompts, shared openings, speculation, a pool small enough to evict, and requests that must
not adopt (prompt logprobs).
"""
from __future__ import annotations

import pytest
import torch

from hyspec import LLM, SamplingParams
from hyspec.errors import ConfigError
from hyspec.kv.pool import KVPool, OutOfKVBlocks
from hyspec.kv.prefix_cache import PrefixCache
from hyspec.kv.sequence_kv import SequenceKV

BS = 4


def _pool(pages: int) -> tuple[KVPool, PrefixCache]:
    pool = KVPool(pages, KVPool.page_bytes_for(1, 1, 4, torch.float32, BS))
    layout = pool.register("target", 1, 1, 4, torch.float32, BS)
    return pool, PrefixCache(pool, layout)


def _prefilled(pool: KVPool, cache: PrefixCache, tokens: list[int]) -> SequenceKV:
    kv = SequenceKV(pool, cache.layout)
    kv.reserve(len(tokens))
    kv.num_tokens = len(tokens)
    cache.insert(tokens, kv.pages)
    return kv


def test_a_prompt_finds_the_full_pages_of_the_same_opening_and_nothing_else():
    pool, cache = _pool(16)
    a = list(range(10))  # pages [0..3], [4..7] full; [8, 9] partial: not cached
    kv = _prefilled(pool, cache, a)
    assert len(cache) == 2
    assert cache.match(a, len(a) - 1) == kv.pages[:2]
    assert cache.match(a[:8] + [99], 8) == kv.pages[:2]
    assert cache.match(a[:7] + [99, 8, 9], 9) == kv.pages[:1]  # the second page's tokens differ
    assert cache.match([99] + a[1:], 9) == []  # the first page differs: nothing after it can match
    assert cache.match(a, 7) == kv.pages[:1]  # the limit keeps the last token(s) for prefill
    # the same second page's tokens after a different first page are another chain
    b = [50, 51, 52, 53] + a[4:8]
    _prefilled(pool, cache, b)
    assert len(cache) == 4 and cache.match(b, 8) != cache.match(a, 8)
    assert cache.stats.hits > 0 and cache.stats.queries >= cache.stats.hits


def test_cached_pages_outlive_their_request_and_are_evicted_leaves_first_when_the_pool_runs_dry():
    pool, cache = _pool(6)
    kv = _prefilled(pool, cache, list(range(12)))  # three full pages, chained
    pages = list(kv.pages)
    kv.release()
    assert pool.num_free == 3 and len(cache) == 3  # the cache holds them
    got = pool.allocate(cache.layout.owner, 4)  # one more than is free: the chain's leaf goes
    assert len(got) == 4 and len(cache) == 2 and pages[2] in got
    assert cache.match(list(range(12)), 11) == pages[:2]
    pool.free(cache.layout.owner, got)
    held = SequenceKV(pool, cache.layout)
    held.adopt(cache.match(list(range(12)), 11), 8)  # a live holder: its pages are not evictable
    with pytest.raises(OutOfKVBlocks):
        pool.allocate(cache.layout.owner, 5)
    held.release()
    cache.reset()
    assert len(cache) == 0
    pool.assert_all_free()


def test_adopted_pages_are_read_only():
    pool, cache = _pool(8)
    _prefilled(pool, cache, list(range(8)))
    kv = SequenceKV(pool, cache.layout)
    kv.adopt(cache.match(list(range(8)) + [1], 8), 8)
    from hyspec.errors import KVOwnershipError

    with pytest.raises(KVOwnershipError):
        kv.check_writable(4, 1)
    kv.reserve(9)
    kv.check_writable(8, 1)  # the sequence's own next page
    with pytest.raises(ValueError):
        kv.adopt([], 0)


def test_a_single_page_is_checked_as_a_list_of_pages_is():
    """check_owner's one-page path (every decoding step) refuses exactly what the array path refuses."""
    from hyspec.errors import KVOwnershipError

    pool, cache = _pool(8)
    other = pool.register("drafter", 1, 1, 4, torch.float32, BS)
    mine, theirs = pool.allocate(cache.layout.owner, 2), pool.allocate(other.owner, 1)
    pool.share(cache.layout.owner, mine[:1])
    cases = [([mine[1]], True, None), ([mine[0]], False, None), ([mine[0]], True, "sequences share"),
             ([theirs[0]], False, "owned by drafter"), ([99], False, "outside the pool"),
             ([-1], False, "outside the pool")]
    for pages, exclusive, error in cases:
        for form in (pages, pages + pages):  # one page, and the same page twice through the array path
            if error is None:
                pool.check_owner(cache.layout.owner, form, exclusive=exclusive)
            else:
                with pytest.raises(KVOwnershipError, match=error):
                    pool.check_owner(cache.layout.owner, form, exclusive=exclusive)


def _repeats(llm: LLM) -> list[list[int]]:
    head = "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\n"
    prompts = [head + "def mul(a, b):", head + "class Foo:\n    def", head + "def mul(a, b):", "x = [1, 2, 3]\n",
               head + "class Foo:\n    def"]
    return [llm.tokenizer.encode(p) for p in prompts]


@pytest.mark.parametrize("spec", [None, {"method": "suffix"}, {"method": "ngram", "num_speculative_tokens": 3,
                                                                "prompt_lookup_min": 1, "prompt_lookup_max": 3}])
def test_greedy_tokens_are_the_same_with_the_prefix_cache_and_without(tiny_ckpt, spec):
    path = str(tiny_ckpt[0])
    params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    off = LLM(path, dtype="float32", kv_cache_bytes=8 << 20, block_size=4, speculative_config=spec)
    on = LLM(path, dtype="float32", kv_cache_bytes=8 << 20, block_size=4, speculative_config=spec,
             enable_prefix_caching=True)
    prompts = _repeats(off)
    expected = [[o.outputs[0].token_ids for o in off.generate([p], params)][0] for p in prompts]  # one by one
    got = [[o.outputs[0].token_ids for o in on.generate([p], params)][0] for p in prompts]
    assert got == expected
    stats = on.engine.prefix_cache.stats
    assert stats.hits >= 2 * (len(prompts[0]) - 1) // 4 * 4  # the repeats found their whole prompt's pages
    # one batch that mixes hits and misses
    both = on.generate(prompts, params)
    assert [o.outputs[0].token_ids for o in both] == expected
    on.close(), off.close()
    assert on.reset_prefix_cache() and not off.reset_prefix_cache()
    on.engine.pool.assert_all_free()


def test_a_small_pool_evicts_cached_prefixes_instead_of_refusing_requests(tiny_ckpt):
    path = str(tiny_ckpt[0])
    page = 2 * 2 * 4 * 2 * 16 * 4  # layers * (k, v) * block_size * kv_heads * head_dim * fp32
    small = LLM(path, dtype="float32", block_size=4, max_model_len=48, kv_cache_bytes=14 * page,
                enable_prefix_caching=True)
    ref = LLM(path, dtype="float32", block_size=4, max_model_len=48, kv_cache_bytes=14 * page)
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    prompts = [f"def f{i}(a, b):\n    return a * {i} + b" for i in range(8)]
    for p in prompts:  # each leaves its pages in the cache; later ones need them back
        assert small.generate([p], params)[0].outputs[0].token_ids == ref.generate([p], params)[0].outputs[0].token_ids
    cache = small.engine.prefix_cache
    assert cache.stats.evicted_pages > 0 and len(cache) <= small.engine.pool.num_pages
    small.engine.pool.check_invariants()


def test_requests_for_prompt_logprobs_prefill_in_full(tiny_ckpt):
    llm = LLM(str(tiny_ckpt[0]), dtype="float32", kv_cache_bytes=8 << 20, block_size=4, enable_prefix_caching=True)
    prompt = "def add(a, b):\n    return a + b\n"
    first = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=4, prompt_logprobs=1))[0]
    hits = llm.engine.prefix_cache.stats.hits
    again = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=4, prompt_logprobs=1))[0]
    assert llm.engine.prefix_cache.stats.hits == hits  # nothing adopted: every prompt row's logprobs exist
    assert len(again.prompt_logprobs) == len(first.prompt_logprobs) == len(first.prompt_token_ids)
    assert again.outputs[0].token_ids == first.outputs[0].token_ids


def test_enable_prefix_caching_must_be_a_bool(tiny_ckpt):
    with pytest.raises(ConfigError, match="enable_prefix_caching"):
        LLM(str(tiny_ckpt[0]), dtype="float32", kv_cache_bytes=8 << 20, enable_prefix_caching="yes")


def test_requests_arriving_together_with_one_opening_prefill_it_once(tiny_ckpt):
    """In-batch prefix sharing (scheduler.py): a request whose opening pages a running prefill writes waits for
    them and adopts them, instead of prefilling them in the same step; tokens are those of plain decoding."""
    path = str(tiny_ckpt[0])
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    ref = LLM(path, dtype="float32", kv_cache_bytes=8 << 20, block_size=4)
    on = LLM(path, dtype="float32", kv_cache_bytes=8 << 20, block_size=4, enable_prefix_caching=True)
    prompts = _repeats(ref) * 2  # five prompts, three sharing a long opening, each twice: one batch
    expected = [o.outputs[0].token_ids for o in ref.generate(prompts, params)]
    assert [o.outputs[0].token_ids for o in on.generate(prompts, params)] == expected
    scheduler, stats = on.engine.scheduler, on.engine.prefix_cache.stats
    assert scheduler.passed_over > 0  # the repeats and the shared openings waited for the first prefill's pages
    assert stats.hits >= (len(prompts) - 2) * 4  # and then adopted at least a page each (all but the two cold)
    on.reset_prefix_cache()
    scheduler.prefix_block_size = None  # sharing off, caching on: the batch prefills every opening itself
    hits = stats.hits
    assert [o.outputs[0].token_ids for o in on.generate(prompts, params)] == expected
    assert stats.hits - hits < hits
    on.close(), ref.close()
    on.reset_prefix_cache()
    on.engine.pool.assert_all_free()


def test_prompt_logprobs_requests_never_wait_and_caching_off_never_passes_over(tiny_ckpt):
    path = str(tiny_ckpt[0])
    prompt = "def add(a, b):\n    return a + b\n"
    on = LLM(path, dtype="float32", kv_cache_bytes=8 << 20, block_size=4, enable_prefix_caching=True)
    outs = on.generate([prompt] * 3, SamplingParams(temperature=0, max_tokens=4, prompt_logprobs=1))
    assert on.engine.scheduler.passed_over == 0 and all(len(o.prompt_logprobs) == len(o.prompt_token_ids) for o in outs)
    off = LLM(path, dtype="float32", kv_cache_bytes=8 << 20, block_size=4)
    off.generate([prompt] * 3, SamplingParams(temperature=0, max_tokens=4))
    assert off.engine.scheduler.passed_over == 0
    on.close(), off.close()
