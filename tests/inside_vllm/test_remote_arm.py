"""Remote CPU drafting as an arm of hyspec's vLLM proposer, with in-process workers standing in for Ray's (the
same hyspec.remote host and protocol, on threads of this process): drafts from a worker, a worker that dies or is
slow (no draft for those rows that step, then the local fallback, never a stalled step), a cluster that is not
there (said once, counted, drafted locally), and the remote options' errors.  The run with a real Ray worker
killed under a real vLLM is tests/inside_vllm/test_vllm_remote_kill.py (slow tier)."""
from __future__ import annotations

import json
import logging
import time
from types import SimpleNamespace

import pytest
from hyspec.errors import ConfigError
from hyspec.vllm import HyspecProposer, VllmOptions, load_options
from hyspec.vllm.options import RemoteArmOptions

from tests.inside_vllm.test_request_state import FakeRunner

VOCAB = 128
REP = [5, 6, 7, 8, 9, 10, 5, 6, 7, 8, 9, 10, 5, 6, 7]  # an ngram worker continues it with 8, 9, 10, 5
FAST = {"ping_interval_ms": 20, "max_missed_pings": 3, "draft_deadline_ms": 2000, "startup_timeout_s": 30.0}


def vllm_config(k: int = 4):
    return SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=k),
                           model_config=SimpleNamespace(max_model_len=256, get_vocab_size=lambda: VOCAB))


def ngram_workers(count: int = 1, k: int = 4):
    """In-process hosts of an ngram drafter, built as hyspec.remote builds a Ray worker's."""
    from hyspec.drafters.methods import MethodSpec
    from hyspec.remote.factory import worker_init
    from hyspec.remote.transport import InProcessHandle
    from hyspec.remote.worker import build_host
    from hyspec.vllm.remote_arm import TargetShape

    init = worker_init(TargetShape(VOCAB, 256), MethodSpec("ngram", None, k, 2, 5))
    return [InProcessHandle(lambda: build_host(init)) for _ in range(count)]


def remote_proposer(handles, method: str = "remote", **remote) -> HyspecProposer:
    options = VllmOptions(method=method, prompt_lookup_min=2,
                          remote=RemoteArmOptions(method="ngram", **{**FAST, **remote}))
    return HyspecProposer(vllm_config(), options, remote_handles=handles)


def wait_for(condition, seconds: float = 10.0) -> None:
    end = time.monotonic() + seconds
    while not condition() and time.monotonic() < end:
        time.sleep(0.01)
    assert condition()


def test_rows_are_drafted_by_the_remote_worker():
    proposer = remote_proposer(ngram_workers())
    try:
        runner = FakeRunner(proposer)
        drafts = runner.propose_draft_token_ids([("A", 3, REP, [7]), ("B", 2, [40, 41], [41])])
        assert drafts == [[8, 9, 10, 5], []]  # B: nothing to match
        assert proposer.stats["remote_drafts"] == 1 and proposer.stats["remote_rows_without_draft"] == 1
        assert proposer.remote.metrics.snapshot()["drafts"]["remote"] == 1
        # A goes on (its worker only gets the new tokens), B finishes: its worker is told to forget it
        more = REP + [8, 9]
        assert runner.propose_draft_token_ids([("A", 3, more, [8, 9])]) == [[10, 5, 6, 7]]
        assert proposer.requests.live.keys() == {"A"}
    finally:
        proposer.remote.close()


def test_a_dead_worker_costs_its_rows_one_step_then_they_draft_locally():
    (worker,) = ngram_workers()
    proposer = remote_proposer([worker])  # fallback: suffix, drafted in the proposer's process
    try:
        runner = FakeRunner(proposer)
        assert runner.propose_draft_token_ids([("A", 3, REP, [7])]) == [[8, 9, 10, 5]]
        worker.kill()  # the worker process died
        t = time.perf_counter()
        assert runner.propose_draft_token_ids([("A", 3, REP + [8], [8])]) == [[]]  # no draft, not a stall
        assert time.perf_counter() - t < 1.0
        wait_for(lambda: not proposer.remote.available())  # 3 missed pings: down
        drafts = runner.propose_draft_token_ids([("A", 3, REP + [8, 9], [9])])
        assert drafts == [[10, 5, 6, 7]]  # suffix, from the request's own tokens
        assert proposer.stats["remote_fallback_rows"] == 1 and proposer.stats["drafts_own"] == 1
        assert proposer.remote.metrics.snapshot()["failovers"] == 1
        # it comes back (a restarted actor): its rows draft remotely again after two good pings
        worker.restart()
        wait_for(proposer.remote.available)
        assert runner.propose_draft_token_ids([("A", 3, REP + [8, 9, 10], [10])]) == [[5, 6, 7, 8]]
        assert proposer.stats["remote_drafts"] == 2
    finally:
        proposer.remote.close()


def test_a_slow_worker_means_no_draft_for_that_step_within_the_deadline():
    (worker,) = ngram_workers()
    proposer = remote_proposer([worker], draft_deadline_ms=50)
    try:
        runner = FakeRunner(proposer)
        worker.set_fault(delay_ms=400).result(5)
        t = time.perf_counter()
        assert runner.propose_draft_token_ids([("A", 3, REP, [7])]) == [[]]
        assert time.perf_counter() - t < 0.3  # the 50 ms deadline, not the worker's 400 ms
        assert proposer.remote.metrics.snapshot()["draft_timeouts"] == 1
        assert proposer.stats["remote_rows_without_draft"] == 1
    finally:
        proposer.remote.close()


def test_a_cluster_that_is_not_there_is_said_once_and_the_rows_draft_locally(caplog, monkeypatch):
    from hyspec.remote import factory
    from hyspec.remote.transport import RemoteUnavailable

    def unreachable(address):
        raise RemoteUnavailable(f"speculative_config.ray_address {address!r}: cannot reach 127.0.0.1:9")

    monkeypatch.setattr(factory.cluster, "connect", unreachable)
    with caplog.at_level(logging.WARNING):
        proposer = remote_proposer(None, ray_address="127.0.0.1:9")
        runner = FakeRunner(proposer)
        assert runner.propose_draft_token_ids([("A", 3, REP, [7])]) == [[8, 9, 10, 5]]  # suffix, here
        for more in ([8], [8, 9]):
            runner.propose_draft_token_ids([("A", 3, REP + more, [more[-1]])])
    said = [r for r in caplog.records if "remote drafting is unavailable" in r.getMessage()]
    assert len(said) == 1 and "suffix" in said[0].getMessage()
    assert proposer.remote.metrics.snapshot()["connect_failures"] == 1
    assert proposer.stats["remote_fallback_rows"] == 3 and proposer.stats["remote_drafts"] == 0
    proposer.remote.close()


def test_without_a_fallback_the_rows_of_an_absent_cluster_get_no_draft(monkeypatch):
    from hyspec.remote import factory
    from hyspec.remote.transport import RemoteUnavailable

    monkeypatch.setattr(factory.cluster, "connect", lambda a: (_ for _ in ()).throw(RemoteUnavailable("no Ray")))
    proposer = remote_proposer(None, fallback="none")
    assert FakeRunner(proposer).propose_draft_token_ids([("A", 3, REP, [7])]) == [[]]
    proposer.remote.close()


def test_the_hybrid_weighs_the_remote_arm_and_scrapes_the_workers_health():
    pytest.importorskip("prometheus_client")
    from prometheus_client import generate_latest

    options = VllmOptions(method="hybrid", hybrid_arms=("remote",), prompt_lookup_min=2,
                          remote=RemoteArmOptions(method="ngram", **FAST))
    proposer = HyspecProposer(vllm_config(), options, remote_handles=ngram_workers())
    try:
        from hyspec.vllm.metrics import collector
        from prometheus_client import CollectorRegistry

        registry = CollectorRegistry()
        registry.register(collector(lambda: proposer.stats, proposer.gauges))
        proposer.remote.metrics.register_prometheus(registry)
        runner = FakeRunner(proposer)
        tokens = list(REP)
        for _ in range(12):
            tokens.append(tokens[-6])
            runner.propose_draft_token_ids([("A", 3, tokens, [tokens[-1]])])
        assert proposer.stats["hybrid_steps_remote"] > 0 and proposer.stats["remote_drafts"] > 0
        text = generate_latest(registry).decode()
        assert 'hyspec_vllm_hybrid_steps_total{arm="remote"}' in text
        assert 'hyspec_remote_worker_up{method="ngram",worker="inproc-' in text
        assert 'hyspec_vllm_remote_worker_pid{worker="inproc-' in text
    finally:
        proposer.remote.close()


def test_the_endpoint_shows_a_worker_up_missing_pings_down_and_back_after_its_restart():
    """What the kill drill reads on hyspec's endpoint, in order: up with no misses; killed, missed pings climbing
    to the failover; restarted (a new incarnation), up again with the misses cleared and one rejoin."""
    pytest.importorskip("prometheus_client")
    from prometheus_client import CollectorRegistry, generate_latest

    (worker,) = ngram_workers()
    proposer = remote_proposer([worker])
    registry = CollectorRegistry()
    proposer.remote.metrics.register_prometheus(registry)

    def sample(name: str) -> float:
        for line in generate_latest(registry).decode().splitlines():
            if line.startswith(f'hyspec_remote_{name}{{method="ngram"'):
                return float(line.rpartition(" ")[2])
        raise AssertionError(f"hyspec_remote_{name} is not on the endpoint")

    try:
        runner = FakeRunner(proposer)
        wait_for(lambda: sample("worker_up") == 1.0 and sample("worker_missed_pings") == 0.0)
        assert runner.propose_draft_token_ids([("A", 3, REP, [7])]) == [[8, 9, 10, 5]]
        worker.kill()
        wait_for(lambda: sample("worker_missed_pings") >= 1.0)
        # the counter moves under the proposer's lock, the worker's gauges right after it: wait for both
        wait_for(lambda: sample("failovers_total") == 1.0 and sample("worker_up") == 0.0)
        assert sample("worker_missed_pings") >= 3.0
        worker.restart()
        wait_for(lambda: sample("rejoins_total") == 1.0 and sample("worker_up") == 1.0)
        assert sample("worker_missed_pings") < 3.0  # cleared by the good pings (a loaded box may miss one since)
        assert sample("worker_restarts_total") == 1.0 and sample("failovers_total") == 1.0
        # drafting resumes on the new incarnation, which gets the request's whole history again
        assert runner.propose_draft_token_ids([("A", 3, REP + [8, 9, 10], [10])]) == [[5, 6, 7, 8]]
        assert proposer.stats["remote_drafts"] == 2
    finally:
        proposer.remote.close()


@pytest.mark.parametrize("remote, key, message", [
    ('"local"', "remote", "JSON object"),
    ('{"metod": "ngram"}', "remote.metod", "unknown option"),
    ('{"method": "eagle3"}', "remote.method", "hidden"),
    ('{"fallback": "eagle"}', "remote.fallback", "not one of suffix, ngram, none"),
    ('{"draft_deadline_ms": 0}', "remote.draft_deadline_ms", "1..60000"),
    ('{"num_workers": "2"}', "remote.num_workers", "must be a int"),
    ('{"num_workers": 0}', "remote.num_workers", ">= 1"),
    ('{"ray_address": " "}', "remote.ray_address", "empty"),
    ('{"pipelining": 1}', "remote.pipelining", "must be a bool"),
])
def test_bad_remote_settings_are_errors_naming_the_key(tmp_path, remote, key, message):
    path = tmp_path / "hyspec.json"
    path.write_text(f'{{"method": "remote", "remote": {remote}}}')
    with pytest.raises(ConfigError, match=message) as err:
        load_options(str(path))
    assert err.value.key == key


def test_remote_settings_from_the_file_and_an_unknown_arm(tmp_path):
    path = tmp_path / "hyspec.json"
    path.write_text(json.dumps({"method": "hybrid", "hybrid_arms": ["suffix", "remote"],
                                "remote": {"ray_address": "10.0.0.5:6379", "num_workers": 2, "model": None}}))
    options = load_options(str(path))
    assert options.uses_remote and options.remote == RemoteArmOptions(ray_address="10.0.0.5:6379", num_workers=2)
    path.write_text(json.dumps({"method": "hybrid", "hybrid_arms": ["suffix", "remote9"]}))
    with pytest.raises(ConfigError, match="remote9.*suffix, ngram, remote") as err:
        load_options(str(path))
    assert err.value.key == "hybrid_arms"
