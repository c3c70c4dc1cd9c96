"""Speculative metrics (plain numbers in core, Prometheus at scrape) and the draft-quality monitor."""
from __future__ import annotations

import logging
import re
import subprocess
import sys
import threading

import pytest

from hyspec.spec.config import QualityConfig, SpeculativeConfig
from hyspec.spec.metrics import REJECTION_CAUSES, SpecMetrics
from hyspec.spec.quality import DraftQualityMonitor


def recorded() -> SpecMetrics:
    m = SpecMetrics(model_name="tiny-code", engine="0")
    m.record_step("ngram", "spec", num_drafts=4, num_draft_tokens=12, accepted_per_position=[3, 2, 1],
                  rejection_causes={"token_mismatch": 3}, draft_seconds=0.0004, verify_seconds=0.02)
    m.record_step("ngram", "spec", num_drafts=2, num_draft_tokens=8, accepted_per_position=[2, 2, 1, 0],
                  rejection_causes={"probability_rejected": 1}, draft_seconds=0.003, verify_seconds=0.02)
    m.record_step("eagle", "control", num_drafts=1, num_draft_tokens=2, accepted_per_position=[1, 0],
                  rejection_causes={}, draft_seconds=None, verify_seconds=7.0)
    m.record_rejection("draft_timeout", "ngram", "spec")
    return m


def test_snapshot_counts_everything_per_method_and_arm():
    snap = recorded().snapshot()
    ngram = snap["methods"]["ngram"]["spec"]
    assert (ngram["steps"], ngram["drafts"], ngram["draft_tokens"], ngram["accepted_tokens"]) == (2, 6, 20, 11)
    assert ngram["accepted_per_position"] == [5, 4, 2, 0]
    assert ngram["acceptance_rate"] == pytest.approx(11 / 20)
    assert ngram["mean_acceptance_length"] == pytest.approx(1 + 11 / 6)  # vLLM's convention: + bonus token
    assert ngram["rejections"] == {"token_mismatch": 3, "probability_rejected": 1, "draft_timeout": 1}
    draft = ngram["draft_seconds"]
    assert draft["count"] == 2 and draft["sum"] == pytest.approx(0.0034)
    assert dict(draft["buckets"])[0.0005] == 1 and dict(draft["buckets"])[0.005] == 2
    eagle = snap["methods"]["eagle"]["control"]
    assert eagle["draft_seconds"]["count"] == 0  # not measured, not recorded
    assert eagle["verify_seconds"]["buckets"][-1] == [float("inf"), 1]  # above every bound
    assert snap["totals"] == {"drafts": 7, "draft_tokens": 22, "accepted_tokens": 12,
                              "accepted_per_position": [6, 4, 2, 0],
                              "rejections": {"token_mismatch": 3, "probability_rejected": 1, "draft_timeout": 1}}
    empty = SpecMetrics().snapshot()
    assert empty["methods"] == {} and empty["totals"]["drafts"] == 0


def test_unknown_causes_and_arms_are_programming_errors():
    m = SpecMetrics()
    with pytest.raises(ValueError, match="rejection cause"):
        m.record_rejection("bad_luck", "ngram", "spec")
    with pytest.raises(ValueError, match="arm"):
        m.record_step("ngram", "treatment", 1, 1, [1], {}, None, None)
    with pytest.raises(ValueError, match="rejection cause"):
        m.record_step("ngram", "spec", 1, 1, [0], {"oops": 1}, None, None)
    for cause in REJECTION_CAUSES:
        m.record_rejection(cause, "ngram", "control")
    assert set(m.snapshot()["methods"]["ngram"]["control"]["rejections"]) == set(REJECTION_CAUSES)


def _exposition(m: SpecMetrics) -> tuple[str, dict]:
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    registry = CollectorRegistry()
    m.register_prometheus(registry)
    text = generate_latest(registry).decode()
    samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return text, samples


def lab(**labels) -> tuple:
    return tuple(sorted(labels.items()))


def test_prometheus_exposition_has_hyspec_names_and_vllm_aliases():
    pytest.importorskip("prometheus_client")
    text, samples = _exposition(recorded())
    spec = lab(arm="spec", method="ngram")
    assert samples[("hyspec_spec_drafts_total", spec)] == 6
    assert samples[("hyspec_spec_draft_tokens_total", spec)] == 20
    assert samples[("hyspec_spec_accepted_tokens_total", spec)] == 11
    assert samples[("hyspec_spec_accepted_tokens_per_pos_total", lab(arm="spec", method="ngram", position="1"))] == 4
    assert samples[("hyspec_spec_rejections_total", lab(arm="spec", cause="draft_timeout", method="ngram"))] == 1
    assert samples[("hyspec_spec_acceptance_rate", spec)] == pytest.approx(0.55)
    assert samples[("hyspec_spec_mean_acceptance_length", spec)] == pytest.approx(1 + 11 / 6)
    assert samples[("hyspec_spec_draft_seconds_bucket", lab(arm="spec", le="0.0005", method="ngram"))] == 1
    assert samples[("hyspec_spec_draft_seconds_count", spec)] == 2
    assert samples[("hyspec_spec_verify_seconds_bucket", lab(arm="control", le="+Inf", method="eagle"))] == 1
    vllm = lab(engine="0", model_name="tiny-code")
    assert samples[("vllm:spec_decode_num_drafts_total", vllm)] == 7
    assert samples[("vllm:spec_decode_num_draft_tokens_total", vllm)] == 22
    assert samples[("vllm:spec_decode_num_accepted_tokens_total", vllm)] == 12
    assert samples[("vllm:spec_decode_num_accepted_tokens_per_pos_total", lab(engine="0", model_name="tiny-code", position="0"))] == 6
    # the TYPE line carries _total or not depending on the prometheus_client version
    assert re.search(r"^# TYPE vllm:spec_decode_num_drafts(_total)? counter$", text, re.M)
    assert 'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="tiny-code",position="2"} 2.0' in text


def test_scrape_sees_later_steps_without_re_registering():
    pytest.importorskip("prometheus_client")
    from prometheus_client import CollectorRegistry, generate_latest

    m = SpecMetrics()
    registry = CollectorRegistry()
    m.register_prometheus(registry)
    assert b"vllm:spec_decode_num_drafts_total" in generate_latest(registry)
    m.record_step("mtp", "spec", 3, 6, [3, 1], {}, 0.001, 0.01)
    assert b'hyspec_spec_drafts_total{arm="spec",method="mtp"} 3.0' in generate_latest(registry)


def test_core_metrics_work_without_prometheus_client():
    code = ("import sys; sys.modules['prometheus_client'] = None\n"  # import of it now fails
            "from hyspec.spec.metrics import SpecMetrics\n"
            "from hyspec.spec.quality import DraftQualityMonitor\n"
            "m = SpecMetrics(); m.record_step('ngram', 'spec', 1, 2, [1, 0], {}, 0.001, 0.01)\n"
            "assert m.snapshot()['totals']['accepted_tokens'] == 1\n"
            "try:\n    m.register_prometheus()\nexcept ImportError:\n    print('ok')\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


def test_recording_and_scraping_from_two_threads():
    m = SpecMetrics()
    stop = threading.Event()

    def scrape():
        while not stop.is_set():
            m.snapshot()

    t = threading.Thread(target=scrape)
    t.start()
    for i in range(2000):
        m.record_step(f"m{i % 7}", "spec", 1, 3, [1, 1, 0], {"token_mismatch": 1}, 0.001, 0.002)
    stop.set()
    t.join()
    assert m.snapshot()["totals"]["drafts"] == 2000


# ---------------------------------------------------------------- draft-quality monitor

def monitor(metrics=None, **quality) -> DraftQualityMonitor:
    cfg = SpeculativeConfig.from_dict({"method": "ngram", "quality": {"window": 20, **quality}})
    return DraftQualityMonitor(cfg, metrics)


def test_low_acceptance_warns_once_after_the_window_and_recovers(caplog):
    metrics = SpecMetrics()
    mon = monitor(metrics)
    with caplog.at_level(logging.INFO, logger="hyspec.spec.quality"):
        states = [mon.observe("eagle", 2, 10) for _ in range(60)]  # acceptance 0.2
    assert [s.low_acceptance for s in states].index(True) == 19  # the 20th step completes the window
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "eagle" in warnings[0].getMessage() and "low acceptance" in warnings[0].getMessage()
    assert metrics.snapshot()["quality"]["eagle"]["low_acceptance"] == {"degraded": True, "warnings": 1}
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="hyspec.spec.quality"):
        for _ in range(200):
            state = mon.observe("eagle", 9, 10)
    assert not state.low_acceptance and state.ewma > 0.6
    # one "recovered" line (the jump from 0.2 to 0.9 may also flag the window as unstable for a while)
    lines = [r for r in caplog.records if "low acceptance" in r.getMessage()]
    assert [r.levelno for r in lines] == [logging.INFO] and "recovered" in lines[0].getMessage()
    assert metrics.snapshot()["quality"]["eagle"]["low_acceptance"] == {"degraded": False, "warnings": 1}


def test_unstable_acceptance_warns_on_a_high_standard_deviation(caplog):
    mon = monitor()
    with caplog.at_level(logging.WARNING, logger="hyspec.spec.quality"):
        for i in range(40):
            state = mon.observe("dflash", 5 if i % 2 else 10, 10)  # 1.0, 0.5, ...: std 0.25, mean 0.75
    assert state.unstable and not state.low_acceptance
    assert state.std == pytest.approx(0.25)
    assert len(caplog.records) == 1 and "unstable" in caplog.records[0].getMessage()


def test_steady_good_drafts_raise_nothing_and_thresholds_are_configurable(caplog):
    with caplog.at_level(logging.WARNING, logger="hyspec.spec.quality"):
        mon = monitor()
        for i in range(100):
            state = mon.observe("mtp", 8 if i % 2 else 7, 10)  # 0.8 / 0.7: std 0.05
        assert not state.low_acceptance and not state.unstable
        strict = monitor(min_acceptance=0.9, max_std=0.01)
        for i in range(100):
            state = strict.observe("mtp", 8 if i % 2 else 7, 10)
        assert state.low_acceptance and state.unstable
    assert len(caplog.records) == 2
    assert mon.observe("mtp", 0, 0).steps == 100  # a step that drafted nothing is not a judgement


def test_quality_metrics_are_exported():
    pytest.importorskip("prometheus_client")
    metrics = SpecMetrics()
    mon = DraftQualityMonitor(QualityConfig(window=5), metrics)
    for _ in range(10):
        mon.observe("ngram", 0, 4)
    _, samples = _exposition(metrics)
    key = lab(method="ngram", reason="low_acceptance")
    assert samples[("hyspec_spec_draft_quality_degraded", key)] == 1.0
    assert samples[("hyspec_spec_draft_quality_warnings_total", key)] == 1.0
    mon.reset("ngram")
    assert mon.state("ngram") is None
    assert metrics.snapshot()["quality"]["ngram"]["low_acceptance"]["degraded"] is False
