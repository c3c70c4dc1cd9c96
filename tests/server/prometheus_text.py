"""Reading a server's /metrics in tests, as Prometheus would (prometheus_client's own text parser)."""
from __future__ import annotations

from typing import Any

from prometheus_client.parser import text_string_to_metric_families


class Scrape:
    """One /metrics scrape: ``scrape.value("name_total", method="ngram")`` and friends."""

    def __init__(self, text: str):
        self.text = text
        self.samples: list[tuple[str, dict[str, str], float]] = [
            (s.name, dict(s.labels), s.value) for fam in text_string_to_metric_families(text) for s in fam.samples]

    def value(self, name: str, default: float | None = None, **labels: str) -> float:
        """The sample ``name`` with exactly ``labels``; ``default`` if absent (None: absent is an error)."""
        for sample_name, sample_labels, value in self.samples:
            if sample_name == name and sample_labels == labels:
                return value
        if default is None:
            raise AssertionError(f"no sample {name}{labels or ''} on /metrics")
        return default

    def by(self, name: str, label: str, **fixed: str) -> dict[str, float]:
        """``{value of label: sample}`` over the samples ``name`` whose other labels are ``fixed``."""
        out = {}
        for sample_name, sample_labels, value in self.samples:
            if sample_name == name and label in sample_labels:
                rest = {k: v for k, v in sample_labels.items() if k != label}
                if rest == fixed:
                    out[sample_labels[label]] = value
        return out

    def labels_of(self, name: str) -> list[dict[str, str]]:
        return [labels for sample_name, labels, _ in self.samples if sample_name == name]


def scrape(client: Any) -> Scrape:
    """GET /metrics with an httpx.Client (or anything with ``.get`` returning ``.text``)."""
    r = client.get("/metrics")
    assert r.status_code == 200, r.text
    return Scrape(r.text)
