"""What hyspec's proposer keeps inside vLLM follows requests, not batch rows: requests finish and join between
steps and rows move.  vLLM's model runner is stood in by the two attributes the proposer reads from its caller
(``input_batch.req_ids``, ``input_batch.num_prompt_tokens``), calling ``propose`` as vLLM 0.32's
``propose_draft_token_ids`` does."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from hyspec.vllm import HyspecProposer, VllmOptions


def vllm_config(k: int = 4, max_model_len: int = 256):
    return SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=k),
                           model_config=SimpleNamespace(max_model_len=max_model_len))


class FakeRunner:
    """Rows: (request id, prompt length, tokens so far, this step's sampled tokens)."""

    def __init__(self, proposer: HyspecProposer):
        self.drafter = proposer
        self.input_batch = SimpleNamespace(req_ids=[], num_prompt_tokens=np.zeros(0, dtype=np.int32))

    def propose_draft_token_ids(self, rows: list[tuple[str, int, list[int], list[int]]]) -> list[list[int]]:
        self.input_batch.req_ids = [r[0] for r in rows]
        self.input_batch.num_prompt_tokens = np.array([r[1] for r in rows], dtype=np.int32)
        width = max(len(r[2]) for r in rows)
        ids = np.zeros((len(rows), width), dtype=np.int32)
        for i, r in enumerate(rows):
            ids[i, :len(r[2])] = r[2]
        counts = np.array([len(r[2]) for r in rows], dtype=np.int32)
        return self.drafter.propose([r[3] for r in rows], counts, ids, slot_mappings=None)


PROMPT_A = [20, 21, 22]
ANSWER = [30, 31, 32, 33, 34, 35, 36, 37, 38, 39]


def test_a_finished_response_is_drafted_from_by_a_later_request():
    proposer = HyspecProposer(vllm_config(k=4), VllmOptions())
    runner = FakeRunner(proposer)
    a = PROMPT_A + ANSWER
    runner.propose_draft_token_ids([("A", 3, a, [a[-1]])])
    # A leaves the batch; B (another prompt) starts the same answer: the rest comes from A's response
    b = [40, 41, 30, 31, 32]
    drafts = runner.propose_draft_token_ids([("B", 2, b, [32])])
    assert proposer.stats["cached_responses"] == 1
    assert drafts == [[33, 34, 35]]  # a 3-token match drafts 3 (max_spec_factor 1.0, vLLM's default)
    assert proposer.stats["drafts_cache"] == 1
    # without request ids (a direct call) nothing is remembered across requests: no draft for B
    bare = HyspecProposer(vllm_config(k=4), VllmOptions())
    bare.propose([[a[-1]]], np.array([len(a)]), np.array([a]))
    assert bare.propose([[32]], np.array([len(b)]), np.array([b])) == [[]]
    assert bare.stats["steps_without_request_ids"] == 2


def test_state_follows_the_request_when_rows_move_and_others_join_and_finish():
    proposer = HyspecProposer(vllm_config(k=3), VllmOptions())
    runner = FakeRunner(proposer)
    rep = [5, 6, 7, 8, 5, 6, 7]
    other = [11, 12, 13, 11, 12]
    first = runner.propose_draft_token_ids([("A", 2, rep, [7]), ("B", 2, other, [12])])
    # A finished; C joined at row 0; B moved to row 1 and generated one more token
    other2 = other + [13]
    moved = runner.propose_draft_token_ids([("C", 1, [9, 9, 9], [9]), ("B", 2, other2, [13, 13][:1])])
    assert set(proposer.requests.live) == {"B", "C"}
    assert proposer.requests.live["B"].tokens == other2  # extended, not rebuilt from another row's tokens
    stateless = HyspecProposer(vllm_config(k=3), VllmOptions())
    assert moved[1] == stateless.draft(np.array(other2), 3)
    assert first[0] == [8, 5, 6]


def test_a_row_that_is_not_the_request_it_claims_is_rebuilt_not_mixed():
    """If the id of a row ever pointed at other tokens (a reused id), the stale state is dropped."""
    proposer = HyspecProposer(vllm_config(k=3), VllmOptions())
    runner = FakeRunner(proposer)
    runner.propose_draft_token_ids([("A", 2, [1, 2, 3, 1, 2], [2])])
    runner.propose_draft_token_ids([("A", 2, [7, 8, 9, 7, 8], [8])])
    assert proposer.requests.live["A"].tokens == [7, 8, 9, 7, 8]


def test_acceptance_comes_back_as_the_rows_sampled_tokens_minus_one():
    proposer = HyspecProposer(vllm_config(k=4), VllmOptions(method="ngram", prompt_lookup_min=2))
    runner = FakeRunner(proposer)
    rep = [5, 6, 7, 8, 9, 5, 6, 7]
    assert runner.propose_draft_token_ids([("A", 1, rep, [7])]) == [[8, 9, 5, 6]]
    # vLLM accepted two of the four drafts and sampled one more token: three tokens this step
    rep2 = rep + [8, 9, 4]
    runner.propose_draft_token_ids([("A", 1, rep2, [8, 9, 4])])
    assert proposer.stats["drafted_tokens"] == 4 + 0 and proposer.stats["accepted_tokens"] == 2


def test_the_response_cache_is_bounded_and_can_be_off():
    proposer = HyspecProposer(vllm_config(k=4), VllmOptions(suffix_max_cached_requests=2))
    runner = FakeRunner(proposer)
    for i in range(4):
        runner.propose_draft_token_ids([(f"R{i}", 1, [50 + i, 60, 61, 62], [62])])
    runner.propose_draft_token_ids([("last", 1, [1, 2], [2])])
    assert proposer.stats["cached_responses"] == 4 and len(proposer.cache) == 2
    off = HyspecProposer(vllm_config(k=4), VllmOptions(suffix_max_cached_requests=0))
    runner = FakeRunner(off)
    runner.propose_draft_token_ids([("A", 1, [50, 60, 61, 62], [62])])
    runner.propose_draft_token_ids([("B", 1, [70, 60, 61], [61])])
    assert off.stats["cached_responses"] == 0 and len(off.cache) == 0


def test_counters_are_scrapeable_from_the_drafting_process():
    import urllib.request

    from hyspec.bench.vllm_server import free_port

    pytest.importorskip("prometheus_client")
    port = free_port()
    proposer = HyspecProposer(vllm_config(k=4), VllmOptions(metrics_port=port))
    proposer.load_model(None)
    runner = FakeRunner(proposer)
    a = PROMPT_A + ANSWER
    runner.propose_draft_token_ids([("A", 3, a, [a[-1]])])
    runner.propose_draft_token_ids([("B", 2, [40, 41, 30, 31, 32], [32])])
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    assert 'hyspec_vllm_drafts_total{source="cache"} 1.0' in text
    assert "hyspec_vllm_draft_tokens_total 3.0" in text
    assert "hyspec_vllm_cached_responses_total 1.0" in text
