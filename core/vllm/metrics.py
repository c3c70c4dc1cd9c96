"""hyspec's own counters from inside vLLM, scrapeable.

vLLM runs a third-party proposer in its model-runner process, not in the API server whose ``/metrics`` vLLM
serves, and its stats messages carry only its own fields.  So the proposer exports its counters itself: with
``metrics_port`` set (HYSPEC_VLLM_CONFIG), a Prometheus endpoint on 127.0.0.1 in that process, read at scrape
time from the proposer's ``stats`` (one bookkeeping, no copies).  vLLM's ``vllm:spec_decode_*`` counters on its
own endpoint still count the drafts it verified.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

#: stats key -> (metric name without the _total suffix, help, labels)
COUNTERS: dict[str, tuple[str, str, dict[str, str]]] = {
    "drafts_own": ("hyspec_vllm_drafts", "Drafts proposed, by where the continuation came from.", {"source": "own"}),
    "drafts_cache": ("hyspec_vllm_drafts", "Drafts proposed, by where the continuation came from.",
                     {"source": "cache"}),
    "drafts_corpus": ("hyspec_vllm_drafts", "Drafts proposed, by where the continuation came from.",
                      {"source": "corpus"}),
    "drafted_tokens": ("hyspec_vllm_draft_tokens", "Draft tokens proposed to vLLM.", {}),
    "accepted_tokens": ("hyspec_vllm_accepted_tokens",
                        "Draft tokens vLLM accepted (a drafted row's sampled tokens minus one).", {}),
    "cached_responses": ("hyspec_vllm_cached_responses", "Finished responses added to the response cache.", {}),
    "steps_without_request_ids": ("hyspec_vllm_steps_without_request_ids",
                                  "Steps whose caller gave no request ids (drafted from each row alone).", {}),
    **{f"hybrid_steps_{arm}": ("hyspec_vllm_hybrid_steps", "Steps by the hybrid's choice (none: no draft).",
                               {"arm": arm}) for arm in ("suffix", "ngram", "remote", "none")},
    "load_fallback_steps": ("hyspec_vllm_load_fallback_steps",
                            "Steps without drafts because the batch was above load_threshold of max_num_seqs.", {}),
    **{f"canary_requests_{arm}": ("hyspec_vllm_canary_requests",
                                  "Requests by canary arm (control: decoded without drafts).", {"arm": arm})
       for arm in ("spec", "control")},
    **{f"canary_tokens_{arm}": ("hyspec_vllm_canary_tokens", "Tokens committed, by the request's canary arm.",
                                {"arm": arm}) for arm in ("spec", "control")},
    "remote_drafts": ("hyspec_vllm_remote_rows", "Rows sent to remote workers, by outcome.", {"outcome": "drafted"}),
    "remote_rows_without_draft": ("hyspec_vllm_remote_rows", "Rows sent to remote workers, by outcome.",
                                  {"outcome": "no_draft"}),
    "remote_fallback_rows": ("hyspec_vllm_remote_fallback_rows",
                             "Rows of remote steps drafted with remote.fallback (no worker up, or no request id).", {}),
    "quality_warnings": ("hyspec_vllm_quality_warnings",
                         "Draft-quality alerts raised (acceptance EWMA low, or its std high; hyspec.spec.quality).", {}),
}
#: gauges() key -> (metric name, help): labelled values that are true now
GAUGES: dict[str, tuple[str, str]] = {
    "quality_alert": ("hyspec_vllm_quality_alert",
                      "1 while a method's draft-quality alert is raised (reason: low_acceptance, unstable_acceptance)."),
    "remote_worker_pid": ("hyspec_vllm_remote_worker_pid", "A remote draft worker's process id, from its last ping."),
}
Gauges = Callable[[], Mapping[str, list[tuple[Mapping[str, str], float]]]]


def collector(stats: Callable[[], Mapping[str, int]], gauges: Gauges | None = None) -> Any:
    """A prometheus_client collector reading ``stats()`` (and ``gauges()``) at scrape time."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
    from prometheus_client.registry import Collector

    class _ProposerCollector(Collector):
        def collect(self) -> Iterator[Any]:
            values = stats()
            families: dict[str, Any] = {}
            for key, (name, doc, labels) in COUNTERS.items():
                fam = families.get(name)
                if fam is None:
                    fam = families[name] = CounterMetricFamily(name, doc, labels=sorted(labels))
                fam.add_metric([labels[k] for k in sorted(labels)], float(values.get(key, 0)))
            yield from families.values()
            now = gauges() if gauges is not None else {}
            for key, (name, doc) in GAUGES.items():
                samples = now.get(key, [])
                label_names = sorted({k for labels, _ in samples for k in labels})
                fam = GaugeMetricFamily(name, doc, labels=label_names)
                for labels, value in samples:
                    fam.add_metric([labels.get(k, "") for k in label_names], value)
                yield fam

    return _ProposerCollector()


def serve_metrics(port: int, stats: Callable[[], Mapping[str, int]], gauges: Gauges | None = None) -> Any:
    """Start the endpoint on 127.0.0.1:``port`` in a daemon thread; returns the registry it serves."""
    from prometheus_client import CollectorRegistry, start_http_server

    registry = CollectorRegistry()
    registry.register(collector(stats, gauges))
    start_http_server(port, addr="127.0.0.1", registry=registry)
    return registry
