"""Speculative-decoding metrics: plain Python counters in core, Prometheus at scrape time.

The engine calls ``record_step`` once per step: a handful of dict and list
increments under one lock, no prometheus_client call on the hot path.  A
custom collector (``register_prometheus``) turns a snapshot into metric
families only when Prometheus scrapes, and prometheus_client is imported
there, so core runs without it installed.

Exposed (counters get ``_total`` appended by the exposition format):

    hyspec_spec_steps / _drafts / _draft_tokens / _accepted_tokens      counters {method, arm}
    hyspec_spec_accepted_tokens_per_pos                                  counter  {method, arm, position}
    hyspec_spec_rejections                                               counter  {method, arm, cause}
    hyspec_spec_acceptance_rate, hyspec_spec_mean_acceptance_length      gauges   {method, arm}
    hyspec_spec_draft_seconds, hyspec_spec_verify_seconds                histograms {method, arm}
    hyspec_spec_draft_quality_degraded                                   gauge    {method, reason}
    hyspec_spec_draft_quality_warnings                                   counter  {method, reason}

and, summed over methods and arms, vLLM's names so existing dashboards work:
``vllm:spec_decode_num_drafts``, ``vllm:spec_decode_num_draft_tokens``,
``vllm:spec_decode_num_accepted_tokens`` {model_name, engine} and
``vllm:spec_decode_num_accepted_tokens_per_pos`` {model_name, engine, position}.
Mean acceptance length follows vLLM's convention: 1 + accepted / drafts
(the 1 is the bonus token).  The arm label is "spec" or "control" (canary A/B).
"""
from __future__ import annotations

import bisect
import threading
from collections import defaultdict
from typing import Any, Iterator, Mapping, Sequence
from hyspec.spec.ops_metrics import OperatorMetrics

REJECTION_CAUSES = ("token_mismatch", "probability_rejected", "kv_cache_mismatch",
                    "draft_timeout", "draft_unavailable", "budget_zero", "memory_pressure", "ttft_slo",
                    "off_critical_path")
ARMS = ("spec", "control")
QUALITY_REASONS = ("low_acceptance", "unstable_acceptance")
# Step times from sub-millisecond CPU drafts to multi-second stalls.
TIME_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class _Histogram:
    __slots__ = ("counts", "sum")

    def __init__(self) -> None:
        self.counts = [0] * (len(TIME_BUCKETS) + 1)  # last slot: above every bound (+Inf)
        self.sum = 0.0

    def observe(self, seconds: float) -> None:
        self.counts[bisect.bisect_left(TIME_BUCKETS, seconds)] += 1
        self.sum += seconds

    def snapshot(self) -> dict[str, Any]:
        cumulative, running = [], 0
        for bound, n in zip((*TIME_BUCKETS, float("inf")), self.counts):
            running += n
            cumulative.append([bound, running])
        return {"count": running, "sum": self.sum, "buckets": cumulative}


class _Series:
    """Everything recorded for one (method, arm)."""

    __slots__ = ("steps", "drafts", "draft_tokens", "accepted_tokens", "accepted_per_pos",
                 "rejections", "draft_seconds", "verify_seconds")

    def __init__(self) -> None:
        self.steps = self.drafts = self.draft_tokens = self.accepted_tokens = 0
        self.accepted_per_pos: list[int] = []
        self.rejections: dict[str, int] = defaultdict(int)
        self.draft_seconds = _Histogram()
        self.verify_seconds = _Histogram()

    def snapshot(self) -> dict[str, Any]:
        return {
            "steps": self.steps,
            "drafts": self.drafts,
            "draft_tokens": self.draft_tokens,
            "accepted_tokens": self.accepted_tokens,
            "accepted_per_position": list(self.accepted_per_pos),
            "acceptance_rate": self.accepted_tokens / self.draft_tokens if self.draft_tokens else 0.0,
            "mean_acceptance_length": 1.0 + self.accepted_tokens / self.drafts if self.drafts else 1.0,
            "rejections": dict(self.rejections),
            "draft_seconds": self.draft_seconds.snapshot(),
            "verify_seconds": self.verify_seconds.snapshot(),
        }


class SpecMetrics:
    """Speculative metrics of one engine, labelled by method and arm."""

    def __init__(self, model_name: str = "hyspec", engine: str = "0"):
        self.model_name = model_name  # vLLM alias labels
        self.engine = str(engine)
        self._lock = threading.Lock()  # the server thread snapshots while the engine records
        self._series: dict[tuple[str, str], _Series] = {}
        self._quality_degraded: dict[tuple[str, str], bool] = {}
        self._quality_warnings: dict[tuple[str, str], int] = defaultdict(int)
        self.ops = OperatorMetrics()  # drafter residency, SLO fallbacks, KV fragmentation

    # -- hot path ----------------------------------------------------------------------
    def record_step(self, method: str, arm: str, num_drafts: int, num_draft_tokens: int,
                    accepted_per_position: Sequence[int], rejection_causes: Mapping[str, int],
                    draft_seconds: float | None, verify_seconds: float | None) -> None:
        """One engine step for ``method`` in canary ``arm``.

        ``accepted_per_position[j]``: drafts whose position j was accepted
        (vLLM's per-position count); their sum is the accepted token count.
        ``rejection_causes``: cause -> occurrences this step.  Timings are the
        step's drafting and verification wall time (None: not measured).
        """
        if arm not in ARMS:
            raise ValueError(f"SpecMetrics: arm must be one of {ARMS}, got {arm!r}")
        for cause in rejection_causes:
            if cause not in REJECTION_CAUSES:
                raise ValueError(f"SpecMetrics: unknown rejection cause {cause!r}; one of {REJECTION_CAUSES}")
        with self._lock:
            s = self._series.get((method, arm))
            if s is None:
                s = self._series[(method, arm)] = _Series()
            s.steps += 1
            s.drafts += num_drafts
            s.draft_tokens += num_draft_tokens
            per_pos = s.accepted_per_pos
            if len(per_pos) < len(accepted_per_position):
                per_pos.extend([0] * (len(accepted_per_position) - len(per_pos)))
            for j, n in enumerate(accepted_per_position):
                per_pos[j] += n
            s.accepted_tokens += sum(accepted_per_position)
            for cause, n in rejection_causes.items():
                s.rejections[cause] += n
            if draft_seconds is not None:
                s.draft_seconds.observe(draft_seconds)
            if verify_seconds is not None:
                s.verify_seconds.observe(verify_seconds)

    def record_rejection(self, cause: str, method: str, arm: str = "spec", count: int = 1) -> None:
        """A rejection outside a recorded step (a proposer failure, a timed-out remote draft, ...)."""
        if cause not in REJECTION_CAUSES:
            raise ValueError(f"SpecMetrics: unknown rejection cause {cause!r}; one of {REJECTION_CAUSES}")
        if arm not in ARMS:
            raise ValueError(f"SpecMetrics: arm must be one of {ARMS}, got {arm!r}")
        with self._lock:
            s = self._series.get((method, arm))
            if s is None:
                s = self._series[(method, arm)] = _Series()
            s.rejections[cause] += count

    def set_quality(self, method: str, reason: str, degraded: bool) -> None:
        """Draft-quality state from the monitor; a transition to degraded counts one warning."""
        if reason not in QUALITY_REASONS:
            raise ValueError(f"SpecMetrics: unknown quality reason {reason!r}; one of {QUALITY_REASONS}")
        with self._lock:
            was = self._quality_degraded.get((method, reason), False)
            self._quality_degraded[(method, reason)] = degraded
            if degraded and not was:
                self._quality_warnings[(method, reason)] += 1

    def goodput(self, method: str) -> float:
        """Tokens emitted per second of ``method``'s speculative steps (accepted + one per draft), 0 unmeasured."""
        with self._lock:
            s = self._series.get((method, "spec"))
            if s is None:
                return 0.0
            seconds = s.draft_seconds.sum + s.verify_seconds.sum
            return (s.accepted_tokens + s.drafts) / seconds if seconds > 0 else 0.0

    # -- read side ---------------------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        """A consistent, JSON-shaped copy of every series.

        ``{"methods": {method: {arm: series}}, "totals": {...}, "quality": {method: {reason: {...}}}}``
        where a series holds steps, drafts, draft_tokens, accepted_tokens,
        accepted_per_position, acceptance_rate, mean_acceptance_length,
        rejections {cause: n} and the draft_seconds / verify_seconds histograms
        ({count, sum, buckets: [[upper bound, cumulative count], ...]}).
        """
        with self._lock:
            methods: dict[str, dict[str, Any]] = {}
            totals = {"drafts": 0, "draft_tokens": 0, "accepted_tokens": 0, "accepted_per_position": [],
                      "rejections": {}}
            for (method, arm), s in self._series.items():
                methods.setdefault(method, {})[arm] = s.snapshot()
                totals["drafts"] += s.drafts
                totals["draft_tokens"] += s.draft_tokens
                totals["accepted_tokens"] += s.accepted_tokens
                per_pos = totals["accepted_per_position"]
                per_pos.extend([0] * (len(s.accepted_per_pos) - len(per_pos)))
                for j, n in enumerate(s.accepted_per_pos):
                    per_pos[j] += n
                for cause, n in s.snapshot()["rejections"].items():
                    totals["rejections"][cause] = totals["rejections"].get(cause, 0) + n
            quality: dict[str, dict[str, Any]] = {}
            for (method, reason), degraded in self._quality_degraded.items():
                quality.setdefault(method, {})[reason] = {
                    "degraded": degraded, "warnings": self._quality_warnings[(method, reason)]}
        return {"methods": methods, "totals": totals, "quality": quality}

    def register_prometheus(self, registry: Any = None) -> Any:
        """Register a collector on ``registry`` (default: prometheus_client's global REGISTRY).

        Returns the collector, so a caller can ``registry.unregister`` it.
        """
        from prometheus_client import REGISTRY
        from prometheus_client.registry import Collector

        class _SpecCollector(Collector):
            def __init__(self, metrics: SpecMetrics):
                self.metrics = metrics

            def collect(self) -> Iterator[Any]:
                return _metric_families(self.metrics)

        collector = _SpecCollector(self)
        (registry if registry is not None else REGISTRY).register(collector)
        return collector


def _metric_families(metrics: SpecMetrics) -> Iterator[Any]:
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

    snap = metrics.snapshot()
    series = [(method, arm, s) for method, arms in sorted(snap["methods"].items()) for arm, s in sorted(arms.items())]
    labels = ["method", "arm"]

    for name, doc in (("steps", "Engine steps recorded."),
                      ("drafts", "Draft sequences verified."),
                      ("draft_tokens", "Draft tokens verified."),
                      ("accepted_tokens", "Draft tokens accepted.")):
        fam = CounterMetricFamily(f"hyspec_spec_{name}", doc, labels=labels)
        for method, arm, s in series:
            fam.add_metric([method, arm], s[name])
        yield fam

    fam = CounterMetricFamily("hyspec_spec_accepted_tokens_per_pos",
                              "Drafts whose position was accepted.", labels=[*labels, "position"])
    for method, arm, s in series:
        for pos, n in enumerate(s["accepted_per_position"]):
            fam.add_metric([method, arm, str(pos)], n)
    yield fam

    fam = CounterMetricFamily("hyspec_spec_rejections", "Speculation rejected or skipped, by cause.",
                              labels=[*labels, "cause"])
    for method, arm, s in series:
        for cause, n in sorted(s["rejections"].items()):
            fam.add_metric([method, arm, cause], n)
    yield fam

    for name, doc in (("acceptance_rate", "Accepted / drafted tokens since start."),
                      ("mean_acceptance_length", "1 + accepted tokens per draft (vLLM's convention).")):
        fam = GaugeMetricFamily(f"hyspec_spec_{name}", doc, labels=labels)
        for method, arm, s in series:
            fam.add_metric([method, arm], s[name])
        yield fam

    for name, doc in (("draft_seconds", "Drafting time per step."),
                      ("verify_seconds", "Target verification time per step.")):
        fam = HistogramMetricFamily(f"hyspec_spec_{name}", doc, labels=labels)
        for method, arm, s in series:
            h = s[name]
            buckets = [("+Inf" if bound == float("inf") else repr(bound), n) for bound, n in h["buckets"]]
            fam.add_metric([method, arm], buckets, h["sum"])
        yield fam

    degraded = GaugeMetricFamily("hyspec_spec_draft_quality_degraded",
                                 "1 while the draft-quality monitor flags the method.", labels=["method", "reason"])
    warnings = CounterMetricFamily("hyspec_spec_draft_quality_warnings",
                                   "Draft-quality warnings raised.", labels=["method", "reason"])
    for method, reasons in sorted(snap["quality"].items()):
        for reason, q in sorted(reasons.items()):
            degraded.add_metric([method, reason], 1.0 if q["degraded"] else 0.0)
            warnings.add_metric([method, reason], q["warnings"])
    yield degraded
    yield warnings
    yield from metrics.ops.families()

    # vLLM's names, summed over methods and arms, with vLLM's labels.
    vl = [metrics.model_name, metrics.engine]
    totals = snap["totals"]
    for name, key, doc in (("num_drafts", "drafts", "Number of spec decoding drafts."),
                           ("num_draft_tokens", "draft_tokens", "Number of draft tokens."),
                           ("num_accepted_tokens", "accepted_tokens", "Number of accepted tokens.")):
        fam = CounterMetricFamily(f"vllm:spec_decode_{name}", doc, labels=["model_name", "engine"])
        fam.add_metric(vl, totals[key])
        yield fam
    fam = CounterMetricFamily("vllm:spec_decode_num_accepted_tokens_per_pos", "Accepted tokens per draft position.",
                              labels=["model_name", "engine", "position"])
    for pos, n in enumerate(totals["accepted_per_position"]):
        fam.add_metric([*vl, str(pos)], n)
    yield fam
