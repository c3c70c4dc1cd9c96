"""vLLM's ``disable_sliding_window`` (vLLM 0.32: vllm/config/model.py, ``ModelConfig.__post_init__`` and
``_get_and_verify_max_len``): every layer attends fully and max_model_len is capped to the config's
``sliding_window``; a larger max_model_len is an error; a model without a window is unchanged.  Gemma 3's
sliding layers keep their local RoPE table (vLLM picks it from ``layer_types``, not from the window)."""
from __future__ import annotations

import pytest

from hyspec import LLM, SamplingParams
from hyspec.errors import ConfigError
from tests.engine.test_vllm_args import parse
from tests.model.hf_fixtures import make_hf_model

ARGS = dict(dtype="float32", backend="cpu", kv_cache_bytes=4 << 20, skip_tokenizer_init=True)


@pytest.fixture(scope="module")
def gemma3_dir(tmp_path_factory):  # layers: sliding (window 8, local RoPE), full; max_position_embeddings 256
    path = tmp_path_factory.mktemp("gemma3")
    make_hf_model("gemma3", path)
    return path


def test_windows_are_disabled_and_max_model_len_capped_to_the_window(gemma3_dir):
    with LLM(str(gemma3_dir), **ARGS) as llm:
        windowed = llm.engine.model
        assert llm.engine.max_model_len == 256
        assert [layer.self_attn.sliding_window for layer in windowed.layers] == [8, None]
        greedy = SamplingParams(temperature=0, max_tokens=4)
        prompts = [[5, 9, 17], [60, 61, 62, 63]]
        expected = [o.outputs[0].token_ids for o in llm.generate(prompts, greedy)]
    with LLM(str(gemma3_dir), disable_sliding_window=True, **ARGS) as llm:
        model = llm.engine.model
        assert llm.engine.max_model_len == 8
        assert model.config.sliding_windows_disabled and model.config.layer_windows == (8, None)
        assert [layer.self_attn.sliding_window for layer in model.layers] == [None, None]
        assert model._local_layers == windowed._local_layers == {0}  # layer 0 still rotates with the local table
        # within the window nothing was cut anyway: the same tokens
        assert [o.outputs[0].token_ids for o in llm.generate(prompts, greedy)] == expected
    with LLM(str(gemma3_dir), disable_sliding_window=True, max_model_len=6, **ARGS) as llm:
        assert llm.engine.max_model_len == 6


def test_a_max_model_len_past_the_window_is_refused(gemma3_dir):
    with pytest.raises(ConfigError, match=r"max_model_len.*9 exceeds the model's sliding_window \(8\)"):
        LLM(str(gemma3_dir), disable_sliding_window=True, max_model_len=9, **ARGS)


def test_a_model_without_a_window_is_unchanged(tmp_path):
    make_hf_model("llama_gqa", tmp_path)
    with LLM(str(tmp_path), disable_sliding_window=True, max_model_len=200, **ARGS) as llm:
        assert llm.engine.max_model_len == 200 and llm.engine.model.config.layer_windows == ()


def test_serve_takes_the_flag():
    assert vars(parse("/m", "--disable-sliding-window"))["disable_sliding_window"] is True
    assert vars(parse("/m", "--no-disable-sliding-window"))["disable_sliding_window"] is False
    assert vars(parse("/m"))["disable_sliding_window"] is False
