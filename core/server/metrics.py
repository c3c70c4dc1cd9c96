"""The server's Prometheus metrics, on a registry of its own (one per app, so tests can run several).

Per request (observed on the event loop when a request ends): time to first
token, time per output token (after the first), end-to-end latency, finished
requests by reason, prompt and generated tokens.  Per HTTP response: a
counter by endpoint, method and status code.  At scrape time: queue depth,
running requests, KV pool use, engine state.  Each request histogram and the
main gauges also appear under vLLM's metric names so existing dashboards
work.  When the engine speculates, ``engine.spec.register_prometheus`` adds
the speculative metrics (acceptance, drafts, rejections by method and arm) to
the same registry, and a hybrid engine's dispatcher is read at scrape time:
decisions by method, the load fallback's state, the rule file's version and
reload errors, decision latency.

Canary A/B: when the engine speculates, the hyspec_* request metrics (TTFT,
TPOT, e2e, finished requests, prompt and generated tokens) carry an ``arm``
label, "spec" or "control" as the engine's canary assigned it ("unassigned"
for a request refused before it got one), so the comparison is one query::

    histogram_quantile(0.99, sum by (arm, le) (rate(hyspec_time_to_first_token_seconds_bucket[5m])))

The vLLM aliases keep vLLM's labels (model_name only), and an engine that
does not speculate has no arm label at all.

prometheus_client is imported here, and this module is imported only by the
server app (the ``serve`` extra).
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from hyspec.server.async_engine import AsyncEngine, RequestStream

if TYPE_CHECKING:
    from hyspec.engine.engine import LLMEngine

log = logging.getLogger(__name__)

# From a few ms (tiny models, CPU) to minutes (long generations on a loaded server).
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
                   160.0, 640.0)
TOKEN_TIME_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0,
                      2.5, 5.0)
TTFT_BUCKETS = TOKEN_TIME_BUCKETS + (10.0, 20.0, 40.0, 80.0, 160.0)  # includes queueing and prefill
UNASSIGNED = "unassigned"  # the arm label of a request refused before the canary saw it


class ServerMetrics:
    def __init__(self, async_engine: AsyncEngine, model_name: str, registry: CollectorRegistry | None = None):
        self.registry = registry if registry is not None else CollectorRegistry()
        self.model_name = model_name
        engine = async_engine.engine
        #: hyspec_* request metrics are labelled by canary arm when the engine speculates
        self.by_arm = bool(getattr(getattr(engine, "spec", None), "enabled", False))
        r, vm = self.registry, ["model_name"]
        hm = ["model_name", "arm"] if self.by_arm else vm
        self._ttft = [Histogram(name, "Time to first token (seconds, from request arrival).", labels,
                                buckets=TTFT_BUCKETS, registry=r)
                      for name, labels in (("hyspec_time_to_first_token_seconds", hm),
                                           ("vllm:time_to_first_token_seconds", vm))]
        self._tpot = [Histogram(name, "Mean time per output token after the first, per request (seconds).",
                                labels, buckets=TOKEN_TIME_BUCKETS, registry=r)
                      for name, labels in (("hyspec_time_per_output_token_seconds", hm),
                                           ("vllm:request_time_per_output_token_seconds", vm))]
        self._e2e = [Histogram(name, "End-to-end request latency (seconds).", labels, buckets=LATENCY_BUCKETS,
                               registry=r)
                     for name, labels in (("hyspec_e2e_request_latency_seconds", hm),
                                          ("vllm:e2e_request_latency_seconds", vm))]
        self._finished = Counter("hyspec_requests_finished", "Requests ended, by finish reason (stop, length, "
                                 "abort; error: the engine failed; rejected: refused before running).",
                                 [*hm, "finish_reason"], registry=r)
        self._vllm_success = Counter("vllm:request_success", "Requests finished, by reason (vLLM's name).",
                                     ["model_name", "finished_reason"], registry=r)
        self._prompt_tokens = [Counter(name, "Prompt tokens of accepted requests.", labels, registry=r)
                               for name, labels in (("hyspec_prompt_tokens", hm), ("vllm:prompt_tokens", vm))]
        self._generation_tokens = [Counter(name, "Generated tokens.", labels, registry=r)
                                   for name, labels in (("hyspec_generation_tokens", hm),
                                                        ("vllm:generation_tokens", vm))]
        self._http = Counter("hyspec_http_requests", "HTTP responses by endpoint, method and status code.",
                             ["endpoint", "method", "status"], registry=r)
        r.register(_EngineCollector(async_engine, model_name))
        self.spec_collector = _register_spec_metrics(engine, r)
        self.dispatch_collector = _register_dispatch_metrics(engine, r)
        async_engine.on_request_done = self.observe_request

    def observe_request(self, stream: RequestStream) -> None:
        # [hyspec labels, vLLM labels]: each metric pair below is (hyspec_*, vllm:*)
        vllm = (self.model_name,)
        labels = ((self.model_name, getattr(stream, "arm", None) or UNASSIGNED) if self.by_arm else vllm, vllm)
        reason = stream.finish_reason or "error"
        self._finished.labels(*labels[0], reason).inc()
        if reason in ("stop", "length", "abort"):
            self._vllm_success.labels(self.model_name, reason).inc()
        if stream.num_prompt_tokens:
            for c, ls in zip(self._prompt_tokens, labels):
                c.labels(*ls).inc(stream.num_prompt_tokens)
        if stream.num_output_tokens:
            for c, ls in zip(self._generation_tokens, labels):
                c.labels(*ls).inc(stream.num_output_tokens)
        if stream.finish_time is None or reason in ("error", "rejected"):
            return
        for h, ls in zip(self._e2e, labels):
            h.labels(*ls).observe(stream.finish_time - stream.arrival_time)
        if stream.first_token_time is not None:
            for h, ls in zip(self._ttft, labels):
                h.labels(*ls).observe(stream.first_token_time - stream.arrival_time)
            if stream.num_output_tokens > 1:
                tpot = (stream.finish_time - stream.first_token_time) / (stream.num_output_tokens - 1)
                for h, ls in zip(self._tpot, labels):
                    h.labels(*ls).observe(tpot)

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
            (("hyspec_kv_fragmentation_index",), "KV pages held / pages the kept entries need (1 = no waste).",
             stats.kv_fragmentation),
            (("hyspec_server_capacity",), "Requests the server takes before answering 429.", ae.capacity),
            (("hyspec_engine_accepting",), "1 while the server takes new requests.", 1.0 if ae.accepting else 0.0),
        ):
            for name in names:
                fam = GaugeMetricFamily(name, doc, labels=["model_name"])
                fam.add_metric(m, float(value))
                yield fam
        for name, doc, value in (("hyspec_engine_steps", "Engine steps run.", stats.num_steps),
                                 ("hyspec_engine_step_failures", "Engine steps that raised.", stats.num_step_failures),
                                 ("hyspec_kv_compactions", "KV pool compactions run by the fragmentation monitor.",
                                  stats.kv_compactions),
                                 ("hyspec_prefix_cache_queries", "Prompt tokens looked up in the prefix cache.",
                                  stats.prefix_cache_queries),
                                 ("vllm:prefix_cache_queries", "Prompt tokens looked up in the prefix cache.",
                                  stats.prefix_cache_queries),
                                 ("hyspec_prefix_cache_hits", "Prompt tokens found in the prefix cache (not prefilled).",
                                  stats.prefix_cache_hits),
                                 ("vllm:prefix_cache_hits", "Prompt tokens found in the prefix cache (not prefilled).",
                                  stats.prefix_cache_hits)):
            fam = CounterMetricFamily(name, doc, labels=["model_name"])
            fam.add_metric(m, float(value))
            yield fam


def _register_spec_metrics(engine: "LLMEngine", registry: CollectorRegistry) -> Any:
    """Let the speculative decoder add its metrics, when the engine has one that can."""
    spec = getattr(engine, "spec", None)
    register = getattr(spec, "register_prometheus", None)
    if register is None:
        return None
    return register(registry)


def _register_dispatch_metrics(engine: "LLMEngine", registry: CollectorRegistry) -> Any:
    """Export a hybrid engine's dispatcher (``engine.spec.dispatcher``), read at scrape time."""
    dispatcher = getattr(getattr(engine, "spec", None), "dispatcher", None)
    if dispatcher is None or not callable(getattr(dispatcher, "snapshot", None)):
        return None
    collector = _DispatchCollector(dispatcher)
    ours = {fam.name for fam in collector.describe()}
    # Collectors without describe() are invisible to the registry's clash check: look at what they yield.
    theirs = ours & {fam.name for fam in registry.collect()}
    if theirs:
        log.info("dispatcher metrics come from the speculative decoder's collector (%s)", ", ".join(sorted(theirs)))
        return None
    registry.register(collector)
    return collector


class _DispatchCollector(Collector):
    """The hybrid dispatcher's counters, from ``dispatcher.snapshot()`` at each scrape.

    The snapshot is read on the server's thread while the engine thread decides;
    every field is a plain value copied under the GIL, so a scrape may lag one
    step behind but never sees a torn number.
    """

    def __init__(self, dispatcher: Any):
        self.dispatcher = dispatcher

    def describe(self) -> Iterator[Any]:
        # Names only (registration checks them for clashes); no snapshot at registration time.
        for fam in _dispatch_families(None):
            yield fam

    def collect(self) -> Iterator[Any]:
        return _dispatch_families(self.dispatcher.snapshot())


def _dispatch_families(snap: Any) -> Iterator[Any]:
    decisions = CounterMetricFamily("hyspec_dispatch_decisions", "Engine steps by the method the hybrid dispatcher "
                                    "chose (none: plain decoding).", labels=["method"])
    fallback = GaugeMetricFamily("hyspec_dispatch_load_fallback_active",
                                 "1 while the load fallback keeps speculation off.")
    load = GaugeMetricFamily("hyspec_dispatch_load", "The load figure the fallback saw at the last step (0-1).")
    fallback_steps = CounterMetricFamily("hyspec_dispatch_load_fallback_steps",
                                         "Steps sent to plain decoding by the load fallback.")
    engagements = CounterMetricFamily("hyspec_dispatch_load_fallback_engagements",
                                      "Times the load fallback switched speculation off.")
    version = GaugeMetricFamily("hyspec_dispatch_rules_version",
                                "Rule set in force: 1 at start, +1 per successful reload.")
    failures = CounterMetricFamily("hyspec_dispatch_rules_reload_failures",
                                   "Rule file edits refused (the previous rules stayed).")
    error = GaugeMetricFamily("hyspec_dispatch_rules_reload_error", "1 while the newest rule file is refused; "
                              "the label holds the error (file:line:column: message).", labels=["error"])
    latency = GaugeMetricFamily("hyspec_dispatch_decision_latency_seconds",
                                "Decision latency over the dispatcher's recent decisions.", labels=["quantile"])
    bandit_choices = CounterMetricFamily("hyspec_dispatch_bandit_choices", "Steps the bandit policy gave each "
                                         "method, per class of step (context length and batch size buckets).",
                                         labels=["step_class", "method"])
    bandit_goodput = GaugeMetricFamily("hyspec_dispatch_bandit_goodput_tokens_per_second", "The bandit's discounted "
                                       "mean goodput of each method, per class of step.",
                                       labels=["step_class", "method"])
    bandit_explorations = CounterMetricFamily("hyspec_dispatch_bandit_explorations",
                                              "Steps the bandit spent trying a method other than its best.")
    if snap is not None and snap.bandit is not None:
        for (klass, method), n in sorted(snap.bandit.choices.items()):
            bandit_choices.add_metric([klass, method], n)
        for (klass, method), value in sorted(snap.bandit.goodput.items()):
            bandit_goodput.add_metric([klass, method], value)
        bandit_explorations.add_metric([], snap.bandit.explorations)
    if snap is not None:
        for method, n in sorted(snap.decisions.items()):
            decisions.add_metric([method], n)
        fallback.add_metric([], 1.0 if snap.load_fallback_active else 0.0)
        load.add_metric([], snap.load)
        fallback_steps.add_metric([], snap.load_fallback_steps)
        engagements.add_metric([], snap.load_fallback_engagements)
        version.add_metric([], snap.rules_version)
        failures.add_metric([], snap.reload_failures)
        if snap.last_reload_error is not None:
            error.add_metric([snap.last_reload_error], 1.0)
        for quantile, ns in (("0.5", snap.latency_p50_ns), ("0.99", snap.latency_p99_ns)):
            if ns is not None:
                latency.add_metric([quantile], ns * 1e-9)
    yield from (decisions, fallback, load, fallback_steps, engagements, version, failures, error, latency,
                bandit_choices, bandit_goodput, bandit_explorations)
