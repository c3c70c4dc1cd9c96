"""Plain decoding through the engine: identity with transformers, batching, sampling, stopping, bad input."""
from __future__ import annotations

import pytest
import torch

from hyspec import LLM, SamplingParams
from hyspec.errors import RequestError

PROMPTS = ["def add(a, b):", "import os\n", "class Foo:\n    def", "x = [", "return self"]


def hf_greedy(hf, ids: list[int], n: int) -> list[int]:
    with torch.no_grad():
        out = hf.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False, eos_token_id=2, pad_token_id=0)
    return out[0, len(ids):].tolist()


def test_greedy_batch_equals_transformers_one_by_one(tiny_ckpt, tiny_llm):
    _, hf = tiny_ckpt
    params = SamplingParams(temperature=0, max_tokens=24)
    outs = tiny_llm.generate(PROMPTS, params)
    for prompt, out in zip(PROMPTS, outs):
        ids = tiny_llm.tokenizer.encode(prompt)
        assert out.prompt_token_ids == ids
        assert out.outputs[0].token_ids == hf_greedy(hf, ids, 24), prompt
        assert out.outputs[0].text == tiny_llm.tokenizer.decode(out.outputs[0].token_ids)
        assert out.finished and out.outputs[0].finish_reason in ("length", "stop")


def test_chunked_prefill_and_preemption_do_not_change_tokens(tiny_ckpt, tiny_llm):
    params = SamplingParams(temperature=0, max_tokens=30)
    expected = [o.outputs[0].token_ids for o in tiny_llm.generate(PROMPTS, params)]
    # Tiny token budget (chunked prefill) and a pool of 12 pages of 4 tokens: one 48-token sequence
    # fits, five do not, so the scheduler must preempt and re-prefill.
    page = 2 * 2 * 4 * 2 * 16 * 4  # layers * (k, v) * block_size * kv_heads * head_dim * fp32
    small = LLM(str(tiny_ckpt[0]), dtype="float32", max_num_batched_tokens=5, block_size=4, max_model_len=48,
                kv_cache_bytes=12 * page)
    assert small.engine.pool.num_pages == 12
    outs = small.generate(PROMPTS, params)
    assert [o.outputs[0].token_ids for o in outs] == expected
    assert sum(o.metrics is not None for o in outs) == len(PROMPTS)
    small.engine.pool.assert_all_free()


def test_seeded_sampling_is_reproducible_regardless_of_batch(tiny_llm):
    p = SamplingParams(temperature=0.8, top_p=0.9, top_k=50, seed=1234, max_tokens=20)
    alone = tiny_llm.generate(["def add(a, b):"], p)[0].outputs[0].token_ids
    others = [SamplingParams(temperature=1.0, seed=s, max_tokens=30) for s in range(4)]
    batch = tiny_llm.generate(["x = [", "def add(a, b):", "import os\n", "return self", "class"],
                              [others[0], p, others[1], others[2], others[3]])
    assert batch[1].outputs[0].token_ids == alone
    again = tiny_llm.generate(["def add(a, b):"], p)[0].outputs[0].token_ids
    assert again == alone


def test_stop_token_ids_stop_strings_and_max_tokens(tiny_llm):
    base = tiny_llm.generate(["def add(a, b):"], SamplingParams(temperature=0, max_tokens=30))[0].outputs[0]
    tok = base.token_ids[5]
    out = tiny_llm.generate(["def add(a, b):"], SamplingParams(temperature=0, max_tokens=30, stop_token_ids=[tok]))
    first = base.token_ids.index(tok)
    assert out[0].outputs[0].token_ids == base.token_ids[: first + 1]
    assert out[0].outputs[0].finish_reason == "stop" and out[0].outputs[0].stop_reason == tok

    text = base.text
    stop = text[len(text) // 2: len(text) // 2 + 3]
    if stop.strip():
        out = tiny_llm.generate(["def add(a, b):"], SamplingParams(temperature=0, max_tokens=30, stop=[stop]))[0]
        assert out.outputs[0].text == text[: text.index(stop)]
        assert out.outputs[0].stop_reason == stop

    out = tiny_llm.generate(["def add(a, b):"], SamplingParams(temperature=0, max_tokens=3))[0]
    assert len(out.outputs[0].token_ids) == 3 and out.outputs[0].finish_reason == "length"


def test_kv_pool_smaller_than_one_sequence_is_a_config_error(tiny_ckpt):
    from hyspec.errors import ConfigError

    with pytest.raises(ConfigError, match="kv_cache_bytes"):
        LLM(str(tiny_ckpt[0]), dtype="float32", block_size=4, kv_cache_bytes=4096)


def test_token_id_prompts_and_chat(tiny_llm):
    ids = tiny_llm.tokenizer.encode("def add(a, b):")
    a = tiny_llm.generate([{"prompt_token_ids": ids}], SamplingParams(temperature=0, max_tokens=8))[0]
    b = tiny_llm.generate(["def add(a, b):"], SamplingParams(temperature=0, max_tokens=8))[0]
    assert a.outputs[0].token_ids == b.outputs[0].token_ids
    chat = tiny_llm.chat([{"role": "user", "content": "hello"}], SamplingParams(temperature=0, max_tokens=4))
    assert chat[0].prompt.endswith("<|assistant|>\n") and len(chat[0].outputs[0].token_ids) == 4


@pytest.mark.parametrize("kwargs, message", [
    (dict(max_tokens=0), "max_tokens"),
    (dict(max_tokens=-3), "max_tokens"),
    (dict(temperature=-0.1), "temperature"),
    (dict(top_p=0.0), "top_p"),
    (dict(top_p=1.5), "top_p"),
    (dict(top_k=-5), "top_k"),
    (dict(min_p=2.0), "min_p"),
    (dict(top_p=1e-320), "top_p"),
    (dict(temperature=1e39), "temperature"),
    (dict(temperature=float("nan")), "temperature"),
    (dict(top_k=2**40), "top_k"),
    (dict(seed=2**70), "seed"),
])
def test_bad_sampling_params_are_named(kwargs, message):
    with pytest.raises(RequestError, match=message):
        SamplingParams(**kwargs)


def test_bad_request_is_rejected_and_engine_keeps_serving(tiny_llm):
    engine = tiny_llm.engine
    good = engine.add_request("def add(a, b):", SamplingParams(temperature=0, max_tokens=5))
    with pytest.raises(RequestError, match="max_model_len"):
        engine.add_request({"prompt_token_ids": [5] * engine.max_model_len}, SamplingParams())
    with pytest.raises(RequestError, match="prompt_token_ids"):
        engine.add_request({"prompt_token_ids": [5, 10**9]}, SamplingParams())
    with pytest.raises(RequestError, match="empty"):
        engine.add_request("", SamplingParams())
    with pytest.raises(RequestError, match="cannot be tokenized"):
        engine.add_request("\ud800", SamplingParams())
    done = {}
    while engine.has_unfinished_requests():
        for o in engine.step():
            if o.finished:
                done[o.request_id] = o
    assert len(done[good.request_id].outputs[0].token_ids) == 5


def test_abort_frees_kv(tiny_llm):
    engine = tiny_llm.engine
    seq = engine.add_request("def add(a, b):", SamplingParams(temperature=0, max_tokens=50))
    engine.step()
    engine.step()
    assert engine.pool.num_free < engine.pool.num_pages
    engine.abort_request(seq.request_id)
    assert engine.pool.num_free == engine.pool.num_pages
    assert not engine.has_unfinished_requests()
