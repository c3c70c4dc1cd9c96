"""The default model (SmolLM2-135M-Instruct, fp32) behind `hyspec serve`: the openai client's greedy
logprobs equal transformers' log-softmax on the same GGUF within 1e-3, plain and speculating.

transformers is the oracle: it loads the GGUF itself (``gguf_file=``) and scores prompt + completion in
one dense forward; hyspec's numbers come from its paged decode and verification forwards.
"""
from __future__ import annotations

import openai
import pytest
import torch

from hyspec.drafters.methods import drafter_dirs
from tests.model.test_default_model import needs_default

PROMPT = "def fibonacci(n):\n    "
MESSAGES = [{"role": "user", "content": "Name three primary colors."}]
TOLERANCE = 1e-3  # fp32 both sides from the same dequantized weights (logits agree to 8.4e-5 at |logit| ~ 39)


@pytest.fixture(scope="module")
def oracle():
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    from hyspec.assets import default_model
    from hyspec.bench.vs_transformers import load_transformers

    hf = load_transformers(default_model())

    def logsoftmax(ids: list[int]) -> torch.Tensor:
        with torch.no_grad():
            return torch.log_softmax(hf(torch.tensor([ids])).logits[0].float(), dim=-1)

    return logsoftmax


def _serve(speculative_config):
    from hyspec.assets import default_model
    from hyspec.server.app import create_app
    from hyspec.server.launcher import BackgroundServer

    args = {"model": str(default_model()), "dtype": "float32", "kv_cache_bytes": 64 << 20, "max_model_len": 512,
            "max_num_seqs": 4, "speculative_config": speculative_config}
    return BackgroundServer(create_app(args, served_model_name="smollm2")).start()


def _drafter_config(method: str):
    if method == "plain":
        return None
    if method == "ngram":
        return {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 3}
    from hyspec.assets import default_drafter

    try:
        drafter = default_drafter(method)
    except Exception as exc:
        pytest.skip(str(exc))
    return {"method": method, "model": str(drafter), "num_speculative_tokens": 3,
            "controller": {"enabled": False, "profile_at_startup": False}}


@needs_default
@pytest.mark.parametrize("method", ["plain", "ngram", *sorted(drafter_dirs())])
def test_greedy_logprobs_are_transformers_log_softmax(oracle, method):
    server = _serve(_drafter_config(method))
    try:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)
        engine = server.app.state.async_engine.engine
        tok = engine.tokenizer
        r = client.completions.create(model="smollm2", prompt=PROMPT, max_tokens=24, temperature=0, logprobs=5,
                                      echo=True, extra_body={"ignore_eos": True, "return_token_ids": True})
        chat = client.chat.completions.create(model="smollm2", messages=MESSAGES, max_tokens=16, temperature=0,
                                              logprobs=True, top_logprobs=5,
                                              extra_body={"ignore_eos": True, "return_token_ids": True})
        drafted = engine.spec.metrics.snapshot()["totals"]["accepted_tokens"] if engine.spec.enabled else None
    finally:
        server.stop()
    if method != "plain":
        assert drafted > 0, f"{method} accepted no draft: the speculative path was not exercised"

    # completions + echo: prompt tokens (first None) then generated ones, each the oracle's number
    choice = r.choices[0]
    prompt_ids = tok.encode(PROMPT)
    ids = prompt_ids + choice.token_ids
    ref = oracle(ids)
    values = choice.logprobs.token_logprobs
    assert values[0] is None and len(values) == len(ids)
    expected = [ref[i - 1, ids[i]].item() for i in range(1, len(ids))]
    assert max(abs(a - b) for a, b in zip(values[1:], expected)) < TOLERANCE
    for pos, top in enumerate(choice.logprobs.top_logprobs[len(prompt_ids):], start=len(prompt_ids) - 1):
        best = ref[pos].topk(5).values.tolist()
        assert max(abs(a - b) for a, b in zip(sorted(top.values(), reverse=True)[:5], best)) < TOLERANCE

    # chat: the generated tokens after the rendered template
    rendered = tok.encode(tok.apply_chat_template(MESSAGES), add_special_tokens=False)
    out = chat.choices[0].token_ids
    ref = oracle(rendered + out)
    content = chat.choices[0].logprobs.content
    assert len(content) == len(out)
    for j, (token_id, item) in enumerate(zip(out, content)):
        row = ref[len(rendered) - 1 + j]
        assert abs(item.logprob - row[token_id].item()) < TOLERANCE
        assert abs(item.top_logprobs[0].logprob - row.max().item()) < TOLERANCE
