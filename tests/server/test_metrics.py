"""ServerMetrics: what one request contributes (TTFT, TPOT, e2e, reasons, tokens), vLLM aliases, scrape-time
engine gauges, and the speculative decoder's own collector registered on the same per-app registry."""
from __future__ import annotations

import pytest
from prometheus_client import generate_latest
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from hyspec.engine.engine import LLMEngine
from hyspec.server.async_engine import AsyncEngine, RequestStream
from hyspec.server.metrics import ServerMetrics
from tests.server.conftest import ENGINE_ARGS


class FakeSpec:
    """Stands in for engine.spec: only what the server uses of it."""

    enabled = True

    def __init__(self):
        self.registries = []

    def register_prometheus(self, registry):
        class Decisions(Collector):
            def collect(self):
                fam = CounterMetricFamily("hyspec_dispatch_decisions", "test", labels=["method", "arm"])
                fam.add_metric(["ngram", "spec"], 3)
                yield fam

        self.registries.append(registry)
        registry.register(Decisions())


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    return LLMEngine(tiny_model_dir, **ENGINE_ARGS)


def finished_stream(ae, reason, arrival, first, finish, prompt_tokens, output_tokens):
    s = RequestStream.__new__(RequestStream)  # a stream as it looks when it ends, without an event loop
    s.request_id, s.finish_reason = "r", reason
    s.arrival_time, s.first_token_time, s.finish_time = arrival, first, finish
    s.num_prompt_tokens, s.num_output_tokens = prompt_tokens, output_tokens
    return s


def test_one_request_feeds_every_histogram_and_counter(engine):
    ae = AsyncEngine(engine)
    metrics = ServerMetrics(ae, "m")
    assert ae.on_request_done == metrics.observe_request
    metrics.observe_request(finished_stream(ae, "length", 10.0, 10.5, 12.5, prompt_tokens=7, output_tokens=5))
    metrics.observe_request(finished_stream(ae, "rejected", 20.0, None, 20.0, 0, 0))
    get = metrics.registry.get_sample_value
    m = {"model_name": "m"}
    for prefix in ("hyspec_", "vllm:"):
        assert get(f"{prefix}time_to_first_token_seconds_sum", m) == pytest.approx(0.5)
        assert get(f"{prefix}e2e_request_latency_seconds_sum", m) == pytest.approx(2.5)
        assert get(f"{prefix}prompt_tokens_total", m) == 7 and get(f"{prefix}generation_tokens_total", m) == 5
    # TPOT: 4 tokens after the first, in 2 s
    assert get("hyspec_time_per_output_token_seconds_sum", m) == pytest.approx(0.5)
    assert get("vllm:request_time_per_output_token_seconds_count", m) == 1
    assert get("hyspec_requests_finished_total", {**m, "finish_reason": "length"}) == 1
    assert get("hyspec_requests_finished_total", {**m, "finish_reason": "rejected"}) == 1
    assert get("vllm:request_success_total", {**m, "finished_reason": "length"}) == 1
    assert get("hyspec_e2e_request_latency_seconds_count", m) == 1  # the rejected one is not a latency


def test_engine_gauges_are_read_at_scrape_time(engine):
    ae = AsyncEngine(engine, max_queue=3)
    metrics = ServerMetrics(ae, "m")
    get = metrics.registry.get_sample_value
    assert get("hyspec_kv_cache_total_pages", {"model_name": "m"}) == engine.pool.num_pages
    assert get("hyspec_server_capacity", {"model_name": "m"}) == ENGINE_ARGS["max_num_seqs"] + 3
    assert get("vllm:kv_cache_usage_perc", {"model_name": "m"}) == 0.0
    assert get("hyspec_engine_accepting", {"model_name": "m"}) == 1.0
    ae.begin_shutdown()
    assert get("hyspec_engine_accepting", {"model_name": "m"}) == 0.0


def test_speculative_metrics_join_the_app_registry(engine, monkeypatch):
    spec = FakeSpec()
    monkeypatch.setattr(engine, "spec", spec)
    first, second = ServerMetrics(AsyncEngine(engine), "a"), ServerMetrics(AsyncEngine(engine), "b")
    assert spec.registries == [first.registry, second.registry]  # one registry per app, no global state
    text = generate_latest(first.registry).decode()
    assert 'hyspec_dispatch_decisions_total{arm="spec",method="ngram"} 3.0' in text


def test_prefix_cache_counters_follow_the_engine(tiny_model_dir):
    from hyspec.engine.sampling_params import SamplingParams

    eng = LLMEngine(tiny_model_dir, **{**ENGINE_ARGS, "enable_prefix_caching": True, "block_size": 4})
    ae = AsyncEngine(eng)
    metrics = ServerMetrics(ae, "m")
    get = metrics.registry.get_sample_value
    assert get("vllm:prefix_cache_queries_total", {"model_name": "m"}) == 0
    ids = list(range(3, 23))
    for _ in range(2):  # the second request finds the first one's pages
        eng.add_request(ids, SamplingParams(temperature=0, max_tokens=2))
        while eng.has_unfinished_requests():
            eng.step()
    ae._publish_stats()
    assert get("vllm:prefix_cache_queries_total", {"model_name": "m"}) == 2 * (len(ids) - 1)
    assert get("hyspec_prefix_cache_hits_total", {"model_name": "m"}) == 16  # four full pages of 19 tokens
