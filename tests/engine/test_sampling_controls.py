"""Sampling controls (presence / frequency / repetition penalties, logit_bias, min_tokens, bad_words,
allowed_token_ids): vLLM's ranges, each processor against vLLM's formula written out independently,
the look-ahead rule of ``process`` (a row's path counts as output), and the engine's behaviour."""
from __future__ import annotations

import math

import pytest
import torch

from hyspec import LLM, SamplingParams
from hyspec.engine.controls import build_processors
from hyspec.engine.controls.masks import (AllowedTokensProcessor, BadWordsProcessor, LogitBiasProcessor,
                                          MinTokensProcessor)
from hyspec.engine.controls.penalties import PenaltyProcessor
from hyspec.errors import RequestError
from hyspec.seam.processors import TokenProcessor, allowed_prefix

V = 12
CPU = torch.device("cpu")


def vllm_penalties(logits, prompt, output, presence, frequency, repetition):
    """vLLM v0.32 apply_penalties, for one row, written out token by token."""
    out = logits.clone()
    for t in range(len(out)):
        count = output.count(t)
        if t in prompt or count:
            out[t] = out[t] / repetition if out[t] > 0 else out[t] * repetition
        out[t] -= frequency * count + presence * (count > 0)
    return out


@pytest.mark.parametrize("presence, frequency, repetition", [(0.7, 0.0, 1.0), (0.0, 0.4, 1.0), (0.0, 0.0, 1.6),
                                                             (-1.5, 2.0, 0.5), (2.0, -2.0, 3.0)])
def test_penalties_follow_vllm_at_every_path(presence, frequency, repetition):
    torch.manual_seed(0)
    prompt, committed = [1, 2, 2], [3, 4, 3]
    proc = PenaltyProcessor(prompt, V, CPU, presence=presence, frequency=frequency, repetition=repetition)
    proc.commit(committed[:1])
    proc.commit(committed[1:])
    paths = [[], [5], [5, 3], [4, 4, 1]]
    logits = torch.randn(len(paths), V) * 3
    expected = torch.stack([vllm_penalties(logits[j], prompt, committed + p, presence, frequency, repetition)
                            for j, p in enumerate(paths)])
    got = logits.clone()
    proc.process(paths, got)
    torch.testing.assert_close(got, expected)
    again = logits.clone()
    proc.process(paths, again)  # process never changes the committed state
    torch.testing.assert_close(again, expected)
    assert isinstance(proc, TokenProcessor)


def test_logit_bias_and_allowed_tokens():
    logits = torch.zeros(2, V)
    LogitBiasProcessor({3: 2.5, 7: -100.0}, CPU).process([[], [1]], logits)
    assert logits[:, 3].tolist() == [2.5, 2.5] and logits[:, 7].tolist() == [-100.0, -100.0]
    allowed = AllowedTokensProcessor([2, 5], V, CPU)
    allowed.process([[], [2]], logits)
    assert torch.isinf(logits).sum() == 2 * (V - 2) and logits[:, [2, 5]].isfinite().all()
    assert allowed.allowed_prefix([2, 5, 6, 2]) == 2


def test_bad_words_ban_the_last_token_after_the_prefix_including_draft_paths():
    proc = BadWordsProcessor([[4], [6, 7], [1, 2, 3]])
    proc.commit([9, 1])
    logits = torch.zeros(4, V)
    proc.process([[], [2], [6], [2, 5]], logits)
    banned = [sorted(torch.nonzero(torch.isinf(row)).flatten().tolist()) for row in logits]
    assert banned == [[4], [3, 4], [4, 7], [4]]
    assert proc.allowed_prefix([2, 3]) == 1 and proc.allowed_prefix([6, 7]) == 1 and proc.allowed_prefix([5, 4]) == 1
    assert proc.allowed_prefix([2, 5, 6, 8]) == 4


def test_min_tokens_masks_stop_ids_while_the_path_is_short():
    proc = MinTokensProcessor(3, [0, 11], CPU)
    proc.commit([5])
    logits = torch.zeros(3, V)
    proc.process([[], [5], [5, 5]], logits)  # output lengths 1, 2, 3
    assert torch.isinf(logits[:2, [0, 11]]).all() and logits[2].isfinite().all()
    assert proc.allowed_prefix([11]) == 0 and proc.allowed_prefix([5, 0]) == 1 and proc.allowed_prefix([5, 5, 0]) == 3


@pytest.mark.parametrize("kwargs, match", [
    (dict(presence_penalty=2.5), "presence_penalty must be in \\[-2, 2\\]"),
    (dict(frequency_penalty=-3), "frequency_penalty must be in \\[-2, 2\\]"),
    (dict(repetition_penalty=0), "repetition_penalty must be greater than zero"),
    (dict(repetition_penalty=float("inf")), "repetition_penalty must be a finite number"),
    (dict(logit_bias={"x": 1.0}), "logit_bias key 'x'"),
    (dict(logit_bias={3: float("nan")}), "logit_bias\\[3\\]"),
    (dict(allowed_token_ids=[]), "allowed_token_ids must not be empty"),
    (dict(allowed_token_ids=[1, -2]), "allowed_token_ids must be non-negative"),
    (dict(bad_words=["ok", ""]), "bad_words cannot contain an empty string"),
    (dict(min_tokens=5, max_tokens=4), "min_tokens must be in"),
    (dict(min_tokens=1.5), "min_tokens must be an integer"),
])
def test_out_of_range_controls_are_refused_by_name(kwargs, match):
    with pytest.raises(RequestError, match=match):
        SamplingParams(**kwargs)


def test_logit_bias_keys_as_strings_and_vllms_clamp():
    params = SamplingParams(logit_bias={"5": 300.0, 6: -250})
    assert params.logit_bias == {5: 100.0, 6: -100.0}
    assert not SamplingParams().has_controls and params.has_controls


def test_build_orders_processors_as_vllm_and_refuses_unknown_ids():
    params = SamplingParams(repetition_penalty=1.2, logit_bias={1: 1.0}, min_tokens=2, allowed_token_ids=[1, 2])
    procs = build_processors(params, [1], eos_ids={0}, vocab_size=V, tokenizer=None, device=CPU)
    assert [type(p).__name__ for p in procs] == ["AllowedTokensProcessor", "MinTokensProcessor",
                                                 "LogitBiasProcessor", "PenaltyProcessor"]
    assert allowed_prefix(procs, [1, 0, 2]) == 1  # min_tokens forbids the EOS at output position 2
    assert build_processors(SamplingParams(), [1], eos_ids={0}, vocab_size=V, tokenizer=None, device=CPU) == []
    for bad in (dict(logit_bias={V: 1.0}), dict(allowed_token_ids=[0, V + 3])):
        with pytest.raises(RequestError, match="outside the vocabulary"):
            build_processors(SamplingParams(**bad), [1], eos_ids={0}, vocab_size=V, tokenizer=None, device=CPU)
    with pytest.raises(RequestError, match="bad_words needs the tokenizer"):
        build_processors(SamplingParams(bad_words=["x"]), [1], eos_ids={0}, vocab_size=V, tokenizer=None, device=CPU)


# -- through the engine ------------------------------------------------------------------------------

PROMPT = [1, 40, 41, 42, 43, 40, 41, 42, 43, 40, 41]


def greedy_ids(llm, **kw):
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True, **kw)
    return llm.generate([PROMPT], params)[0].outputs[0].token_ids


def test_engine_refuses_unknown_token_ids(tiny_llm):
    vocab = tiny_llm.engine.config.vocab_size
    with pytest.raises(RequestError, match="logit_bias has token ids outside the vocabulary"):
        tiny_llm.generate([PROMPT], SamplingParams(logit_bias={vocab: 5.0}))


def test_controls_change_greedy_output_as_asked(tiny_llm):
    base = greedy_ids(tiny_llm)
    first = base[0]
    assert greedy_ids(tiny_llm, logit_bias={first: -100.0})[0] != first
    assert greedy_ids(tiny_llm, logit_bias={7: 100.0}) == [7] * 16
    allowed = [t for t in range(3, 300, 5)]
    assert set(greedy_ids(tiny_llm, allowed_token_ids=allowed)) <= set(allowed)
    repeated = max(set(base), key=base.count)
    out = greedy_ids(tiny_llm, presence_penalty=2.0, frequency_penalty=2.0)
    assert out.count(repeated) <= base.count(repeated) and out != base


def test_min_tokens_holds_back_a_stop_token(tiny_llm):
    base = greedy_ids(tiny_llm)
    stop = base[2]  # plain decoding would stop at its third token
    params = dict(temperature=0, max_tokens=16, stop_token_ids=[stop])
    short = tiny_llm.generate([PROMPT], SamplingParams(**params))[0].outputs[0]
    assert len(short.token_ids) <= 3 and short.finish_reason == "stop"
    held = tiny_llm.generate([PROMPT], SamplingParams(**params, min_tokens=8))[0].outputs[0]
    assert len(held.token_ids) >= 8 and stop not in held.token_ids[:7]


def test_bad_words_are_never_emitted(tiny_llm):
    tok = tiny_llm.tokenizer
    base = greedy_ids(tiny_llm)
    # a word the output contains whose text tokenizes back to the same ids (vLLM bans the ids of the text)
    word, ids = next((w, base[i:i + n]) for n in (2, 1) for i in range(len(base) - n + 1)
                     if (w := tok.decode(base[i:i + n])).strip()
                     and tok.encode(w.lstrip(), add_special_tokens=False) == base[i:i + n])
    out = greedy_ids(tiny_llm, bad_words=[word])
    assert not any(out[i:i + len(ids)] == ids for i in range(len(out))), (word, ids, out)
    assert out != base


def test_processed_logprobs_are_of_the_controlled_distribution(tiny_ckpt):
    llm = LLM(str(tiny_ckpt[0]), dtype="float32", kv_cache_bytes=8 << 20, logprobs_mode="processed_logprobs")
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True, logprobs=2, logit_bias={7: 100.0})
    out = llm.generate([PROMPT], params)[0].outputs[0]
    assert out.token_ids == [7] * 4
    assert all(math.isclose(lp[7].logprob, 0.0, abs_tol=1e-4) and lp[7].rank == 1 for lp in out.logprobs)
    raw = LLM(str(tiny_ckpt[0]), dtype="float32", kv_cache_bytes=8 << 20).generate([PROMPT], params)[0].outputs[0]
    assert raw.token_ids == [7] * 4 and raw.logprobs[0][7].logprob < -1.0  # raw_logprobs (vLLM's default): the model's
