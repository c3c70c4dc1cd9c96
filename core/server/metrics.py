"""The server's Prometheus metrics, on a registry of its own (one per app, so tests can run several).

Per request (observed on the event loop when a request ends): time to first
token, time per output token (after the first), end-to-end latency, finished
requests by reason, prompt and generated tokens.  Per HTTP response: a
counter by endpoint, method and status code.  At scrape time: queue depth,
running requests, KV pool use, engine state.  Each request histogram and the
main gauges also appear under vLLM's metric names so existing dashboards
work.  When the engine speculates, ``engine.spec.register_prometheus`` adds
the speculative metrics (acceptance, dispatcher decisions, fallback state,
labelled by canary arm) to the same registry.

prometheus_client is imported here, and this module is imported only by the
server app (the ``serve`` extra).
"""
from __future__ import annotations

import logging
from typing import Any, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from hyspec.server.async_engine import AsyncEngine, RequestStream

log = logging.getLogger(__name__)

# From a few ms (tiny models, CPU) to minutes (long generations on a loaded server).
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
                   160.0, 640.0)
TOKEN_TIME_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0,
                      2.5, 5.0)
TTFT_BUCKETS = TOKEN_TIME_BUCKETS + (10.0, 20.0, 40.0, 80.0, 160.0)  # includes queueing and prefill


class ServerMetrics:
    def __init__(self, async_engine: AsyncEngine, model_name: str, registry: CollectorRegistry | None = None):
        self.registry = registry if registry is not None else CollectorRegistry()
        self.model_name = model_name
        r, m = self.registry, ["model_name"]
        self._ttft = [Histogram(name, "Time to first token (seconds, from request arrival).", m,
                                buckets=TTFT_BUCKETS, registry=r)
                      for name in ("hyspec_time_to_first_token_seconds", "vllm:time_to_first_token_seconds")]
        self._tpot = [Histogram(name, "Mean time per output token after the first, per request (seconds).", m,
                                buckets=TOKEN_TIME_BUCKETS, registry=r)
                      for name in ("hyspec_time_per_output_token_seconds",
                                   "vllm:request_time_per_output_token_seconds")]
        self._e2e = [Histogram(name, "End-to-end request latency (seconds).", m, buckets=LATENCY_BUCKETS, registry=r)
                     for name in ("hyspec_e2e_request_latency_seconds", "vllm:e2e_request_latency_seconds")]
        self._finished = Counter("hyspec_requests_finished", "Requests ended, by finish reason (stop, length, "
                                 "abort; error: the engine failed; rejected: refused before running).",
                                 ["model_name", "finish_reason"], registry=r)
        self._vllm_success = Counter("vllm:request_success", "Requests finished, by reason (vLLM's name).",
                                     ["model_name", "finished_reason"], registry=r)
        self._prompt_tokens = [Counter(name, "Prompt tokens of accepted requests.", m, registry=r)
                               for name in ("hyspec_prompt_tokens", "vllm:prompt_tokens")]
        self._generation_tokens = [Counter(name, "Generated tokens.", m, registry=r)
                                   for name in ("hyspec_generation_tokens", "vllm:generation_tokens")]
        self._http = Counter("hyspec_http_requests", "HTTP responses by endpoint, method and status code.",
                             ["endpoint", "method", "status"], registry=r)
        r.register(_EngineCollector(async_engine, model_name))
        self.spec_collector = _register_spec_metrics(async_engine.engine, r)
        async_engine.on_request_done = self.observe_request

    def observe_request(self, stream: RequestStream) -> None:
        labels = (self.model_name,)
        reason = stream.finish_reason or "error"
        self._finished.labels(self.model_name, reason).inc()
        if reason in ("stop", "length", "abort"):
            self._vllm_success.labels(self.model_name, reason).inc()
        if stream.num_prompt_tokens:
            for c in self._prompt_tokens:
                c.labels(*labels).inc(stream.num_prompt_tokens)
        if stream.num_output_tokens:
            for c in self._generation_tokens:
                c.labels(*labels).inc(stream.num_output_tokens)
        if stream.finish_time is None or reason in ("error", "rejected"):
            return
        for h in self._e2e:
            h.labels(*labels).observe(stream.finish_time - stream.arrival_time)
        if stream.first_token_time is not None:
            for h in self._ttft:
                h.labels(*labels).observe(stream.first_token_time - stream.arrival_time)
            if stream.num_output_tokens > 1:
                tpot = (stream.finish_time - stream.first_token_time) / (stream.num_output_tokens - 1)
                for h in self._tpot:
                    h.labels(*labels).observe(tpot)

    def observe_http(self, endpoint: str, method: str, status: int) -> None:
        self._http.labels(endpoint, method, str(status)).inc()

    def exposition(self) -> tuple[bytes, str]:
        """(body, content type) of a /metrics scrape."""
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return generate_latest(self.registry), CONTENT_TYPE_LATEST


class _EngineCollector(Collector):
    """Gauges read at scrape time from the engine thread's last published snapshot."""

    def __init__(self, async_engine: AsyncEngine, model_name: str):
        self.async_engine = async_engine
        self.model_name = model_name

    def collect(self) -> Iterator[Any]:
        ae, stats, m = self.async_engine, self.async_engine.stats, [self.model_name]
        for names, doc, value in (
            (("hyspec_num_requests_running", "vllm:num_requests_running"), "Requests in the running batch.",
             stats.num_running),
            (("hyspec_num_requests_waiting", "vllm:num_requests_waiting"),
             "Requests accepted and waiting to run (queue depth).", ae.num_queued),
            (("hyspec_kv_cache_usage_perc", "vllm:kv_cache_usage_perc"), "KV pool use (0-1).", stats.kv_usage),
            (("hyspec_num_requests_in_flight",), "Requests accepted and not finished.", ae.num_in_flight),
            (("hyspec_kv_cache_free_pages",), "Free KV pool pages.", stats.kv_free_pages),
            (("hyspec_kv_cache_total_pages",), "KV pool pages.", stats.kv_total_pages),
            (("hyspec_server_capacity",), "Requests the server takes before answering 429.", ae.capacity),
            (("hyspec_engine_accepting",), "1 while the server takes new requests.", 1.0 if ae.accepting else 0.0),
        ):
            for name in names:
                fam = GaugeMetricFamily(name, doc, labels=["model_name"])
                fam.add_metric(m, float(value))
                yield fam
        for name, doc, value in (("hyspec_engine_steps", "Engine steps run.", stats.num_steps),
                                 ("hyspec_engine_step_failures", "Engine steps that raised.", stats.num_step_failures)):
            fam = CounterMetricFamily(name, doc, labels=["model_name"])
            fam.add_metric(m, float(value))
            yield fam


def _register_spec_metrics(engine: Any, registry: CollectorRegistry) -> Any:
    """Let the speculative decoder add its metrics, when the engine has one that can."""
    spec = getattr(engine, "spec", None)
    register = getattr(spec, "register_prometheus", None)
    if register is None:
        return None
    return register(registry)
