"""Logprobs and prompt logprobs through LLM.generate: the target's numbers, with speculation on and off.

Oracle: transformers' forward of the same tiny checkpoint (fp32), log-softmaxed.
"""
from __future__ import annotations

import math

import pytest
import torch

from hyspec import LLM, SamplingParams
from hyspec.errors import RequestError

PROMPT = [1, 40, 41, 42, 43, 40, 41, 42, 43, 40, 41, 42, 43, 40, 41]  # repetitive: ngram drafts get accepted


def _oracle(hf, ids: list[int]) -> torch.Tensor:
    """log-softmax of transformers' logits at every position of ``ids`` ([len, V])."""
    with torch.no_grad():
        return torch.log_softmax(hf(torch.tensor([ids])).logits[0].float(), dim=-1)


def _llm(path, **kw) -> LLM:
    return LLM(str(path), dtype="float32", kv_cache_bytes=8 << 20, **kw)


@pytest.fixture(scope="module")
def ngram_llm(tiny_ckpt):
    return _llm(tiny_ckpt[0], speculative_config={"method": "ngram", "num_speculative_tokens": 4,
                                                    "prompt_lookup_min": 1, "prompt_lookup_max": 3})


def test_greedy_logprobs_are_the_targets_with_and_without_speculation(tiny_ckpt, tiny_llm, ngram_llm):
    path, hf = tiny_ckpt
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, logprobs=3)
    plain = tiny_llm.generate([PROMPT], params)[0].outputs[0]
    spec = ngram_llm.generate([PROMPT], params)[0].outputs[0]
    accepted = ngram_llm.engine.spec.metrics.snapshot()["totals"]["accepted_tokens"]
    assert accepted > 0, "ngram accepted nothing: the speculative path was not exercised"
    assert spec.token_ids == plain.token_ids
    oracle = _oracle(hf, PROMPT + plain.token_ids)[len(PROMPT) - 1:-1]
    for out in (plain, spec):
        assert len(out.logprobs) == len(out.token_ids)
        for pos, (tok, entry) in enumerate(zip(out.token_ids, out.logprobs)):
            assert abs(entry[tok].logprob - oracle[pos, tok].item()) < 1e-4
            assert entry[tok].rank == 1  # greedy: the sampled token is the argmax
            top = sorted((lp.rank, tid) for tid, lp in entry.items())
            assert [tid for _, tid in top] == oracle[pos].topk(3).indices.tolist()
        assert math.isclose(out.cumulative_logprob, sum(e[t].logprob for e, t in zip(out.logprobs, out.token_ids)),
                            rel_tol=1e-9)
    assert max(abs(a[t].logprob - b[t].logprob) for a, b, t in zip(plain.logprobs, spec.logprobs, plain.token_ids)) < 1e-5


def test_prompt_logprobs_match_the_oracle_whole_or_chunked(tiny_ckpt, tiny_llm):
    path, hf = tiny_ckpt
    oracle = _oracle(hf, PROMPT)
    chunked = _llm(path, max_num_batched_tokens=4)  # the prompt's rows arrive over four steps
    params = SamplingParams(temperature=0, max_tokens=2, prompt_logprobs=2)
    for llm in (tiny_llm, chunked):
        out = llm.generate([PROMPT], params)[0]
        assert out.prompt_logprobs[0] is None and len(out.prompt_logprobs) == len(PROMPT)
        assert out.outputs[0].logprobs is None  # only asked for the prompt's
        for pos in range(1, len(PROMPT)):
            entry = out.prompt_logprobs[pos]
            tok = PROMPT[pos]
            assert abs(entry[tok].logprob - oracle[pos - 1, tok].item()) < 1e-4
            assert entry[tok].rank == int((oracle[pos - 1] > oracle[pos - 1, tok]).sum()) + 1
            assert len(entry) in (2, 3)  # the prompt token plus the top 2 (it may be one of them)


def test_logprobs_stop_with_the_tokens(tiny_llm):
    base = tiny_llm.generate([PROMPT], SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))[0].outputs[0]
    stop_at = base.token_ids[2]
    out = tiny_llm.generate([PROMPT], SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, logprobs=0,
                                                     stop_token_ids=[stop_at]))[0].outputs[0]
    assert out.token_ids == base.token_ids[:base.token_ids.index(stop_at) + 1]
    assert len(out.logprobs) == len(out.token_ids) and all(len(e) == 1 for e in out.logprobs)


def test_processed_logprobs_follow_the_request(tiny_ckpt):
    llm = _llm(tiny_ckpt[0], logprobs_mode="processed_logprobs")
    out = llm.generate([PROMPT], SamplingParams(temperature=0.7, top_k=5, max_tokens=8, seed=3, logprobs=6))[0]
    for entry in out.outputs[0].logprobs:
        finite = [lp.logprob for lp in entry.values() if lp.logprob > -math.inf]
        assert len(finite) <= 5  # top-k=5 leaves at most five tokens with probability
        assert math.isclose(sum(math.exp(v) for v in finite), 1.0, rel_tol=1e-4) or len(entry) < 6


def test_n_samples_share_one_prefill(tiny_ckpt):
    llm = _llm(tiny_ckpt[0])
    engine = llm.engine
    block = engine.layout.block_size
    prompt = list(range(3, 3 + 2 * block + 5))  # two full pages and a partial one
    fed = []
    run = engine.runner.run
    engine.runner.run = lambda feeds, **kw: (fed.append(sum(len(f.tokens) for f in feeds)), run(feeds, **kw))[1]
    params = SamplingParams(temperature=0.8, n=4, max_tokens=1, seed=11)
    for i, s in enumerate(_fan_out("x", params)):
        engine.add_request(prompt, s.params, s.request_id, s.share_prompt_with)
    engine.step()  # the prefill: one forward over the prompt, then the fork
    assert fed == [len(prompt)], "the prompt was computed more than once"
    # the samples finished at max_tokens=1; while they ran, pages were shared: check with a longer run
    llm.generate([prompt], SamplingParams(temperature=0.8, n=4, max_tokens=8, seed=11))
    engine.pool.assert_all_free()

    pages_before = engine.pool.pages_by_owner()["target"]
    for s in _fan_out("y", SamplingParams(temperature=0.8, n=4, max_tokens=8, seed=11)):
        engine.add_request(prompt, s.params, s.request_id, s.share_prompt_with)
    engine.step()
    # 2 shared full pages + one partial page per sample, instead of 4 x 3 pages
    assert engine.pool.pages_by_owner()["target"] - pages_before == 2 + 4
    assert engine.pool.num_shared == 2
    while engine.has_unfinished_requests():
        engine.step()
    engine.pool.assert_all_free()


def _fan_out(rid, params):
    from hyspec.engine.parallel_sampling import fan_out

    return fan_out(rid, params)


def test_n_samples_equal_separately_seeded_requests(tiny_llm):
    params = SamplingParams(temperature=0.9, n=4, max_tokens=10, seed=5, ignore_eos=True)
    together = tiny_llm.generate([PROMPT], params)[0]
    assert [o.index for o in together.outputs] == [0, 1, 2, 3]
    alone = [tiny_llm.generate([PROMPT], SamplingParams(temperature=0.9, max_tokens=10, seed=5 + i,
                                                        ignore_eos=True))[0].outputs[0].token_ids for i in range(4)]
    assert [o.token_ids for o in together.outputs] == alone
    assert len({tuple(t) for t in alone}) > 1  # the samples differ


def test_best_of_returns_the_highest_mean_logprob(tiny_llm):
    all4 = tiny_llm.generate([PROMPT], SamplingParams(temperature=1.0, n=4, max_tokens=6, seed=2, logprobs=0,
                                                      ignore_eos=True))[0].outputs
    best = tiny_llm.generate([PROMPT], SamplingParams(temperature=1.0, n=2, best_of=4, max_tokens=6, seed=2,
                                                      ignore_eos=True))[0].outputs
    ranked = sorted(all4, key=lambda o: o.cumulative_logprob / len(o.token_ids), reverse=True)
    assert [o.token_ids for o in best] == [o.token_ids for o in ranked[:2]]
    assert [o.index for o in best] == [0, 1] and all(o.logprobs is None for o in best)  # not asked for


def test_a_sample_continues_when_its_leader_is_aborted_first(tiny_llm):
    engine = tiny_llm.engine
    samples = _fan_out("z", SamplingParams(temperature=0.8, n=3, max_tokens=4, seed=1))
    for s in samples:
        engine.add_request(PROMPT, s.params, s.request_id, s.share_prompt_with)
    engine.abort_request(samples[0].request_id)  # before any step: the next sample prefills for the rest
    done = set()
    while engine.has_unfinished_requests():
        done |= {o.request_id for o in engine.step() if o.finished}
    assert done == {samples[1].request_id, samples[2].request_id}
    engine.pool.assert_all_free()


@pytest.mark.parametrize("kwargs, match", [
    ({"n": 2, "temperature": 0}, "n must be 1 when using greedy sampling"),
    ({"best_of": 3, "temperature": 0}, "best_of must be 1 when using greedy sampling"),
    ({"n": 3, "best_of": 2}, "best_of must be at least n"),
    ({"n": 0}, "n must be a positive integer"),
    ({"logprobs": -1}, "logprobs must be None or an integer >= 0"),
])
def test_bad_sampling_combinations_name_the_field(kwargs, match):
    with pytest.raises(RequestError, match=match):
        SamplingParams(**kwargs)


def test_logprobs_above_the_engine_limit_are_refused(tiny_ckpt):
    llm = _llm(tiny_ckpt[0], max_logprobs=5)
    with pytest.raises(RequestError, match=r"logprobs=6 is above this engine's max_logprobs \(5\)"):
        llm.generate([PROMPT], SamplingParams(logprobs=6))
    assert not llm.engine.has_unfinished_requests()


def test_skip_tokenizer_init_speaks_token_ids(tiny_ckpt, tiny_llm):
    llm = _llm(tiny_ckpt[0], skip_tokenizer_init=True)
    assert llm.get_tokenizer() is None
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, logprobs=1)
    out = llm.generate([PROMPT], params)[0].outputs[0]
    ref = tiny_llm.generate([PROMPT], params)[0].outputs[0]
    assert out.token_ids == ref.token_ids and out.text == ""
    assert all(lp.decoded_token is None for e in out.logprobs for lp in e.values())
    with pytest.raises(RequestError, match="skip_tokenizer_init"):
        llm.generate(["text needs a tokenizer"], params)
    with pytest.raises(RequestError, match="skip_tokenizer_init"):
        llm.chat([{"role": "user", "content": "hi"}])
