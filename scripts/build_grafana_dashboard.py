"""Write monitoring/grafana/hyspec-dashboard.json (Grafana's dashboard JSON, schema 39) from the panel list below.

    python scripts/build_grafana_dashboard.py

The dashboard reads a Prometheus data source chosen at import (``${DS_PROMETHEUS}``) and every metric
it uses is one `hyspec serve` exports (tests/server/test_monitoring.py scrapes a live server to check).
"""
from __future__ import annotations

import json
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "monitoring" / "grafana" / "hyspec-dashboard.json"
DS = {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}

# (title, unit, [(expr, legend)]) in reading order: what speculation buys, what it costs, what holds memory
PANELS = [
    ("Generated tokens per second", "short", [
        ("sum(rate(hyspec_generation_tokens_total[1m]))", "tokens/s")]),
    ("Requests running / waiting", "short", [
        ("sum(hyspec_num_requests_running)", "running"), ("sum(hyspec_num_requests_waiting)", "waiting")]),
    ("TTFT p50 / p99", "s", [
        ("histogram_quantile(0.5, sum by (le) (rate(hyspec_time_to_first_token_seconds_bucket[5m])))", "p50"),
        ("histogram_quantile(0.99, sum by (le) (rate(hyspec_time_to_first_token_seconds_bucket[5m])))", "p99")]),
    ("TPOT p50 / p99", "s", [
        ("histogram_quantile(0.5, sum by (le) (rate(hyspec_time_per_output_token_seconds_bucket[5m])))", "p50"),
        ("histogram_quantile(0.99, sum by (le) (rate(hyspec_time_per_output_token_seconds_bucket[5m])))", "p99")]),
    ("Acceptance rate per method", "percentunit", [
        ("sum by (method) (rate(hyspec_spec_accepted_tokens_total{arm=\"spec\"}[5m])) / "
         "sum by (method) (rate(hyspec_spec_draft_tokens_total{arm=\"spec\"}[5m]))", "{{method}}")]),
    ("Mean acceptance length per method", "short", [
        ("hyspec_spec_mean_acceptance_length{arm=\"spec\"}", "{{method}}")]),
    ("Accepted draft tokens per second (vLLM names)", "short", [
        ("sum(rate(vllm:spec_decode_num_accepted_tokens_total[1m]))", "accepted"),
        ("sum(rate(vllm:spec_decode_num_draft_tokens_total[1m]))", "drafted")]),
    ("Rejections by cause", "short", [
        ("sum by (cause) (rate(hyspec_spec_rejections_total[5m]))", "{{cause}}")]),
    ("Dispatcher choices", "short", [
        ("sum by (method) (rate(hyspec_dispatch_decisions_total[5m]))", "{{method}}")]),
    ("Speculation switched off", "short", [
        ("max(hyspec_dispatch_load_fallback_active)", "load fallback"),
        ("max by (reason) (hyspec_spec_fallback_active)", "{{reason}}")]),
    ("Drafter residency", "short", [
        ("hyspec_spec_drafter_resident", "{{method}} resident"),
        ("sum by (method, transition) (increase(hyspec_spec_drafter_transitions_total[15m]))",
         "{{method}} {{transition}}")]),
    ("Draft quality flags", "short", [
        ("hyspec_spec_draft_quality_degraded", "{{method}} {{reason}}")]),
    ("KV cache usage and fragmentation", "short", [
        ("max(hyspec_kv_cache_usage_perc)", "usage (0-1)"),
        ("max(hyspec_kv_fragmentation_index)", "fragmentation index"),
        ("sum(increase(hyspec_kv_compactions_total[15m]))", "compactions / 15 min")]),
    ("Draft and verify time per step (p99)", "s", [
        ("histogram_quantile(0.99, sum by (le, method) (rate(hyspec_spec_draft_seconds_bucket[5m])))",
         "draft {{method}}"),
        ("histogram_quantile(0.99, sum by (le, method) (rate(hyspec_spec_verify_seconds_bucket[5m])))",
         "verify {{method}}")]),
]


def dashboard() -> dict:
    panels = []
    for i, (title, unit, targets) in enumerate(PANELS):
        panels.append({
            "id": i + 1, "type": "timeseries", "title": title, "datasource": DS,
            "gridPos": {"h": 8, "w": 12, "x": 12 * (i % 2), "y": 8 * (i // 2)},
            "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
            "options": {"legend": {"displayMode": "list", "placement": "bottom"}},
            "targets": [{"refId": chr(ord("A") + j), "datasource": DS, "expr": expr, "legendFormat": legend}
                        for j, (expr, legend) in enumerate(targets)],
        })
    return {
        "__inputs": [{"name": "DS_PROMETHEUS", "label": "Prometheus", "type": "datasource",
                      "pluginId": "prometheus", "pluginName": "Prometheus"}],
        "title": "hyspec", "uid": "hyspec-serve", "schemaVersion": 39, "version": 1, "editable": True,
        "time": {"from": "now-1h", "to": "now"}, "refresh": "30s", "tags": ["hyspec", "speculative-decoding"],
        "templating": {"list": []}, "annotations": {"list": []}, "panels": panels,
    }


if __name__ == "__main__":
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(dashboard(), indent=2) + "\n")
    print(f"wrote {OUT} ({len(PANELS)} panels)")
