"""Inside vLLM: the canary's control group (decoded without drafts, stable per request id), the draft-quality
alerts from the acceptance vLLM reports back (hyspec.spec.quality's monitor), and suffix drafting from a
read-only corpus of earlier answers.  vLLM's runner is stood in by test_request_state's FakeRunner."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
from hyspec.errors import ConfigError
from hyspec.policy.canary import CONTROL, SPEC, Canary
from hyspec.vllm import HyspecProposer, VllmOptions

from tests.inside_vllm.test_request_state import FakeRunner

VOCAB = 128
REP = [5, 6, 7, 8, 9, 5, 6, 7]


def vllm_config(k: int = 4, vocab: int = VOCAB):
    return SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=k),
                           model_config=SimpleNamespace(max_model_len=256, get_vocab_size=lambda: vocab))


def test_the_canarys_control_requests_are_decoded_without_drafts():
    proposer = HyspecProposer(vllm_config(), VllmOptions(method="ngram", control_fraction=0.5, canary_salt="t"))
    runner = FakeRunner(proposer)
    ids = [f"req-{i}" for i in range(24)]
    arms = {rid: Canary(0.5, "t").arm(rid) for rid in ids}
    assert set(arms.values()) == {SPEC, CONTROL}  # both arms present in this sample
    for step in range(2):  # the split holds at every step of a request
        drafts = runner.propose_draft_token_ids([(rid, 2, REP, [7] * (step + 1)) for rid in ids])
        for rid, draft in zip(ids, drafts):
            assert draft == ([] if arms[rid] == CONTROL else [8, 9, 5, 6]), rid
    controls = sum(a == CONTROL for a in arms.values())
    assert proposer.stats["canary_requests_control"] == controls
    assert proposer.stats["canary_requests_spec"] == len(ids) - controls
    assert proposer.stats["canary_tokens_control"] == controls * (1 + 2)  # one sampled token, then two


def test_no_canary_by_default_every_request_may_draft():
    proposer = HyspecProposer(vllm_config(), VllmOptions(method="ngram"))
    drafts = FakeRunner(proposer).propose_draft_token_ids([(f"r{i}", 2, REP, [7]) for i in range(8)])
    assert all(d == [8, 9, 5, 6] for d in drafts) and proposer.stats["canary_requests_spec"] == 8


def _alternating_steps(runner: FakeRunner, accepted: list[int]) -> None:
    """One request drafting 4 tokens a step (ngram on 1 2 1 2 ...), vLLM accepting ``accepted[i]`` at step i."""
    tokens = [1, 2, 1, 2, 1, 2]
    runner.propose_draft_token_ids([("A", 1, tokens, [2])])
    for n in accepted:
        tokens = tokens + [1 + (len(tokens) + i) % 2 for i in range(n + 1)]  # the alternation goes on
        runner.propose_draft_token_ids([("A", 1, tokens, tokens[-(n + 1):])])


def test_a_low_acceptance_alert_is_raised_and_scrapeable():
    pytest.importorskip("prometheus_client")
    from hyspec.vllm.metrics import collector
    from prometheus_client import CollectorRegistry, generate_latest

    proposer = HyspecProposer(vllm_config(), VllmOptions(method="ngram", prompt_lookup_min=2, quality_window=4))
    runner = FakeRunner(proposer)
    _alternating_steps(runner, [0] * 3)
    assert not proposer.quality_alerts.get(("ngram", "low_acceptance"))
    _alternating_steps(runner, [0] * 2)  # four steps of EWMA below 0.6 in a row
    assert proposer.quality_alerts[("ngram", "low_acceptance")] is True
    assert proposer.stats["quality_warnings"] == 1
    registry = CollectorRegistry()
    registry.register(collector(lambda: proposer.stats, proposer.gauges))
    text = generate_latest(registry).decode()
    assert 'hyspec_vllm_quality_alert{method="ngram",reason="low_acceptance"} 1.0' in text
    assert "hyspec_vllm_quality_warnings_total 1.0" in text


def test_an_unstable_acceptance_alert_when_its_sd_is_above_the_bound():
    proposer = HyspecProposer(vllm_config(), VllmOptions(method="ngram", prompt_lookup_min=2, quality_window=4,
                                                         quality_min_acceptance=0.0))
    _alternating_steps(FakeRunner(proposer), [4, 0, 4, 0, 4])  # rates 1, 0, 1, 0: sd 0.5 > 0.15
    assert proposer.quality_alerts == {("ngram", "unstable_acceptance"): True}


def _corpus(tmp_path, sequences, vocab: int = VOCAB):
    from hyspec.drafters.suffix.corpus import save_corpus

    tokenizer = SimpleNamespace(get_vocab=lambda: {f"t{i}": i for i in range(vocab)})
    return save_corpus(tmp_path / "corpus", sequences, tokenizer, {"what": "test"}, vocab)


def test_suffix_drafts_from_the_read_only_corpus(tmp_path):
    answer = [30, 31, 32, 33, 34, 35, 36, 37]
    path = _corpus(tmp_path, [answer, [60, 61, 62]])
    proposer = HyspecProposer(vllm_config(), VllmOptions(suffix_corpus=str(path), suffix_max_cached_requests=0))
    runner = FakeRunner(proposer)
    assert runner.propose_draft_token_ids([("A", 2, [40, 41, 30, 31, 32], [32])]) == [[33, 34, 35]]
    assert proposer.stats["drafts_corpus"] == 1
    for setting in ("", "none"):  # off
        off = HyspecProposer(vllm_config(), VllmOptions(suffix_corpus=setting, suffix_max_cached_requests=0))
        assert off.corpus is None
        assert FakeRunner(off).propose_draft_token_ids([("A", 2, [40, 41, 30, 31, 32], [32])]) == [[]]


def test_a_corpus_for_another_vocabulary_or_a_missing_one_is_refused_at_start(tmp_path):
    path = _corpus(tmp_path, [[1, 2, 3]], vocab=64)
    with pytest.raises(ConfigError, match="vocabulary of 64 tokens; the target has 128") as err:
        HyspecProposer(vllm_config(), VllmOptions(suffix_corpus=str(path)))
    assert err.value.key == "suffix_corpus"
    with pytest.raises(ConfigError, match="expected corpus.json") as err:
        HyspecProposer(vllm_config(), VllmOptions(suffix_corpus=str(tmp_path / "nowhere")))


@pytest.mark.parametrize("options, key", [
    ({"control_fraction": 1.0}, "control_fraction"),
    ({"control_fraction": -0.1}, "control_fraction"),
    ({"canary_salt": "x" * 65}, "canary_salt"),
    ({"quality_min_acceptance": 1.5}, "quality_min_acceptance"),
    ({"quality_max_std": 0.6}, "quality_max_std"),
    ({"quality_window": 1}, "quality_window"),
])
def test_bad_canary_and_quality_options_name_the_key(options, key):
    with pytest.raises(ConfigError) as err:
        VllmOptions(**options)
    assert err.value.key == key
