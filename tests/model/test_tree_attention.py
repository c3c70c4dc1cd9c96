"""Tree verification attention equals running each root-to-node path on its own.

Property test over random trees in a ragged batch: the model runs context +
tree nodes in one packed call (ancestor mask, explicit positions); each node's
logits must equal a plain causal run over context + the node's root-to-node path.
"""
from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hyspec.kv.sequence_kv import SequenceKV
from hyspec.model.loader import load_model
from hyspec.seam.forward import ALL_LOGITS, LAST_LOGITS, Feed
from tests.model.hf_fixtures import make_hf_model
from tests.model.paged_decode import make_runner


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = tmp_path_factory.mktemp("tree_model")
    make_hf_model("llama_gqa", path, layers=2)
    return load_model(path, dtype="float32")


def ancestor_mask(parents: list[int]) -> torch.Tensor:
    n = len(parents)
    mask = torch.zeros(n, n, dtype=torch.bool)
    for i in range(n):
        j = i
        while j >= 0:
            mask[i, j] = True
            j = parents[j]
    return mask


def path_to(parents: list[int], i: int) -> list[int]:
    path = []
    while i >= 0:
        path.append(i)
        i = parents[i]
    return path[::-1]


tree_st = st.integers(1, 12).flatmap(
    lambda n: st.tuples(*[st.just(-1)] + [st.integers(0, i - 1) for i in range(1, n)]).map(list))
seq_st = st.tuples(st.integers(1, 40), tree_st)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batch=st.lists(seq_st, min_size=1, max_size=3), block_size=st.sampled_from([4, 16]), seed=st.integers(0, 99))
def test_tree_equals_separate_paths(model, batch, block_size, seed):
    g = torch.Generator().manual_seed(seed)
    pool, layout, runner = make_runner(model, pages=128, block_size=block_size)
    seqs = []
    for ctx_len, parents in batch:
        kv = SequenceKV(pool, layout)
        ctx = torch.randint(3, 128, (ctx_len,), generator=g).tolist()
        tokens = torch.randint(3, 128, (len(parents),), generator=g).tolist()
        kv.reserve(ctx_len + len(parents))
        runner.run([Feed(kv, ctx, 0, logits=LAST_LOGITS)])
        seqs.append((kv, ctx, tokens, parents))

    depths = lambda parents: [len(path_to(parents, i)) - 1 for i in range(len(parents))]  # noqa: E731
    feeds = [Feed(kv, tokens, len(ctx), depths=depths(parents), tree_mask=ancestor_mask(parents), logits=ALL_LOGITS)
             for kv, ctx, tokens, parents in seqs]
    out = runner.run(feeds)

    for b, (kv, ctx, tokens, parents) in enumerate(seqs):
        tree_logits = out.feed_logits(b)
        for i in range(len(parents)):
            solo = SequenceKV(pool, layout)
            path_tokens = [tokens[j] for j in path_to(parents, i)]
            solo.reserve(len(ctx) + len(path_tokens))
            ref = runner.run([Feed(solo, ctx + path_tokens, 0, logits=LAST_LOGITS)]).logits[0]
            torch.testing.assert_close(tree_logits[i], ref, atol=1e-4, rtol=1e-4)
            solo.release()
        kv.release()
    pool.check_invariants()
    assert pool.num_free == pool.num_pages


def test_rollback_equals_never_taking_the_branch(model):
    """Decode after truncating a rejected branch == decode that never went down it."""
    pool, layout, runner = make_runner(model, pages=64, block_size=4)
    prompt = list(range(5, 19))

    def decode(kv, start_token, steps):
        toks = [start_token]
        for _ in range(steps):
            kv.reserve(kv.num_tokens + 1)
            o = runner.run([Feed(kv, [toks[-1]], kv.num_tokens)])
            toks.append(int(o.logits[0].argmax()))
        return toks[1:]

    clean = SequenceKV(pool, layout)
    clean.reserve(64)
    first = int(runner.run([Feed(clean, prompt, 0, logits=LAST_LOGITS)]).logits[0].argmax())
    expected = decode(clean, first, 10)

    rolled = SequenceKV(pool, layout)
    rolled.reserve(64)
    runner.run([Feed(rolled, prompt, 0, logits=LAST_LOGITS)])
    runner.run([Feed(rolled, [first, 77, 78, 79, 80, 81], rolled.num_tokens)])  # a rejected branch, crossing pages
    rolled.truncate(len(prompt))
    assert decode(rolled, first, 10) == expected
    clean.release()
    rolled.release()
    pool.assert_all_free()
