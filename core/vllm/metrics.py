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

from hyspec.vllm.hybrid import ALL_BATCH_CLASSES

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
    **{f"hybrid_batch_{klass}_{what}": (
        "hyspec_vllm_hybrid_decisions",
        "Hybrid steps by batch-size class, and whether any draft was sent (drafted=\"false\": the auto-off, "
        "the load fallback included).", {"batch": klass, "drafted": "true" if what == "drafted" else "false"})
       for klass in ALL_BATCH_CLASSES for what in ("drafted", "plain")},
    "hybrid_cut_tokens": ("hyspec_vllm_hybrid_cut_tokens",
                          "Draft tokens the hybrid's arms drafted and its plan did not send (they would not pay).", {}),
    "hybrid_wave_steps": ("hyspec_vllm_hybrid_wave_steps",
                          ("Steps planned as a wave's (requests admitted together, nothing joined): only rows on "
                           "its critical path may draft."), {}),
    "hybrid_wave_cut_tokens": ("hyspec_vllm_hybrid_wave_cut_tokens",
                               "Draft tokens not sent because their row was ahead of the wave's slowest.", {}),
    "plain_path_steps": ("hyspec_vllm_plain_path_steps",
                         "Steps without draft tokens that vLLM's runner prepared and sampled as plain decoding.", {}),
    "hybrid_probes": ("hyspec_vllm_hybrid_probes",
                      "Steps that sent one row's draft whole after explore_interval steps without drafts.", {}),
    "hybrid_cost_probes": ("hyspec_vllm_hybrid_cost_probes",
                           "Steps left without drafts to measure vLLM's step cost at another token count.", {}),
    "propose_seconds": ("hyspec_vllm_propose_seconds", "Time spent in propose: drafting and planning.", {}),
    "propose_calls": ("hyspec_vllm_propose_calls", "Calls of propose (one per vLLM step that had rows).", {}),
}
#: gauges() key -> (metric name, help): labelled values that are true now
GAUGES: dict[str, tuple[str, str]] = {
    "quality_alert": ("hyspec_vllm_quality_alert",
                      "1 while a method's draft-quality alert is raised (reason: low_acceptance, unstable_acceptance)."),
    "remote_worker_pid": ("hyspec_vllm_remote_worker_pid", "A remote draft worker's process id, from its last ping."),
    "step_cost": ("hyspec_vllm_step_cost_seconds",
                  "The hybrid's fit of vLLM's step time (term: fixed, per_token scored, per_token_past_knee; "
                  "knee_tokens is the knee, in tokens)."),
}
Gauges = Callable[[], Mapping[str, list[tuple[Mapping[str, str], float]]]]


def collector(stats: Callable[[], Mapping[str, float]], gauges: Gauges | None = None) -> Any:
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


def serve_metrics(port: int, stats: Callable[[], Mapping[str, float]], gauges: Gauges | None = None) -> Any:
    """Start the endpoint on 127.0.0.1:``port`` in a daemon thread; returns the registry it serves."""
    from prometheus_client import CollectorRegistry, start_http_server

    registry = CollectorRegistry()
    registry.register(collector(stats, gauges))
    start_http_server(port, addr="127.0.0.1", registry=registry)
    return registry
