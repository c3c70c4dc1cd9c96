"""The operator artefacts in monitoring/: the alert rules pass promtool (check and unit tests) and every
metric the rules and the Grafana dashboard read is one a live `hyspec serve` exports."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import httpx
import pytest
import yaml

from tests.model.tiny_checkpoint import make_checkpoint

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "monitoring" / "prometheus" / "hyspec-alerts.yml"
RULE_TESTS = ROOT / "monitoring" / "prometheus" / "hyspec-alerts.test.yml"
DASHBOARD = ROOT / "monitoring" / "grafana" / "hyspec-dashboard.json"
NAME = re.compile(r"(?<![\w:])((?:hyspec|vllm)[_:][A-Za-z0-9_:]*)")
SUFFIXES = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_sum", "_count", "_created"),
            "gauge": ("",), "summary": ("_sum", "_count", "_created"), "untyped": ("",)}


def _rules() -> list[dict]:
    return [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]


def _names(exprs: list[str], recorded: set[str]) -> set[str]:
    return {n for e in exprs for n in NAME.findall(e) if n not in recorded}


@pytest.fixture(scope="module")
def exported(tiny_model_dir, tmp_path_factory) -> set[str]:
    """Metric names of a speculating server (hybrid over ngram and a draft model) after some traffic."""
    from hyspec.server.app import create_app
    from hyspec.server.launcher import BackgroundServer

    draft = tmp_path_factory.mktemp("monitoring_draft")
    make_checkpoint(draft, layers=1, seed=7)
    rules = draft / "rules.json"  # one request at a time: ngram (it drafts and gets rejected on random weights)
    rules.write_text(json.dumps([{"when": "batch_size <= 1", "method": "ngram"}, {"method": "draft_model"}]))
    args = {"model": str(tiny_model_dir), "dtype": "float32", "kv_cache_bytes": 8 << 20, "max_model_len": 96,
            "speculative_config": {"method": "hybrid", "num_speculative_tokens": 3,
                                   "controller": {"enabled": False, "profile_at_startup": False},
                                   "hybrid": {"rules_path": str(rules), "methods": [
                                       {"method": "ngram", "prompt_lookup_min": 1, "prompt_lookup_max": 2},
                                       {"method": "draft_model", "model": str(draft)}]}}}
    server = BackgroundServer(create_app(args, served_model_name="tiny")).start()
    try:
        for prompt in ("a b a b a b a b", "def f(x): return x", "x = 1\nx = 1\nx = 1"):
            r = httpx.post(server.url + "/v1/completions", timeout=60,
                           json={"prompt": prompt, "max_tokens": 24, "temperature": 0, "ignore_eos": True})
            assert r.status_code == 200, r.text
        text = httpx.get(server.url + "/metrics", timeout=30).text
    finally:
        server.stop()
    names = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, family, kind = line.split(" ", 3)
            names |= {family + s for s in SUFFIXES.get(kind, ("",))}
        elif line and not line.startswith("#"):
            names.add(line.split("{")[0].split(" ")[0])
    return names


def test_alert_rules_read_only_exported_metrics(exported):
    rules = _rules()
    recorded = {r["record"] for r in rules if "record" in r}
    used = _names([r["expr"] for r in rules], recorded)
    assert used and not used - exported, sorted(used - exported)
    alerts = {r["alert"] for r in rules if "alert" in r}
    assert {"HyspecTTFTP99High", "HyspecKVFragmentationHigh", "HyspecDraftAcceptanceLow",
            "HyspecDraftUtilisationSwings", "HyspecDrafterReleased"} <= alerts
    assert all(r["annotations"].get("action") for r in rules if "alert" in r)  # every alert says what to do


def test_dashboard_reads_only_exported_metrics(exported):
    board = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in board["panels"] for t in p["targets"]]
    used = _names(exprs, set())
    assert not used - exported, sorted(used - exported)
    for needed in ("hyspec_spec_accepted_tokens_total", "hyspec_spec_rejections_total",
                   "hyspec_dispatch_decisions_total", "hyspec_dispatch_load_fallback_active",
                   "hyspec_spec_drafter_resident", "hyspec_kv_cache_usage_perc",
                   "hyspec_time_to_first_token_seconds_bucket", "hyspec_time_per_output_token_seconds_bucket"):
        assert needed in used, needed
    from scripts.build_grafana_dashboard import dashboard

    assert board == json.loads(json.dumps(dashboard())), "regenerate: python scripts/build_grafana_dashboard.py"


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed (apt-get install prometheus)")
def test_promtool_checks_and_unit_tests_the_rules():
    check = subprocess.run(["promtool", "check", "rules", str(RULES)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    unit = subprocess.run(["promtool", "test", "rules", str(RULE_TESTS)], capture_output=True, text=True)
    assert unit.returncode == 0 and "SUCCESS" in unit.stdout, unit.stdout + unit.stderr
