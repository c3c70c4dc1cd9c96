"""HybridDispatcher: rule order, unloaded methods, default rules, load fallback, counters, hot reload."""
from __future__ import annotations

import json
import logging
import os
import time

import pytest

from hyspec.policy.dispatcher import HybridDispatcher
from hyspec.policy.rules import RuleFileError
from hyspec.policy.signals import StepSignals
from hyspec.errors import ConfigError

ALL = ("eagle", "mtp", "dflash")


def write_rules(path, rules) -> None:
    path.write_text(json.dumps(rules, indent=1))


@pytest.fixture
def rules_file(tmp_path):
    path = tmp_path / "rules.json"
    write_rules(path, [{"when": "load > 0.5", "method": "none"},
                       {"when": "context_length > 1000", "method": "dflash"},
                       {"when": "context_length > 100", "method": "mtp"},
                       {"method": "eagle"}])
    return path


@pytest.mark.parametrize("signals, expected", [
    (dict(context_length=5000, mem_usage=0.5, batch_size=16), "dflash"),
    (dict(context_length=5000, mem_usage=0.72, batch_size=16), "eagle"),  # KV pool too full for dflash
    (dict(context_length=800, max_context_length=9000, batch_size=4), "mtp"),  # the rules read the mean
    (dict(context_length=1024, batch_size=8), "mtp"),
    (dict(context_length=1024, batch_size=9), "eagle"),
    (dict(context_length=2000, batch_size=2, remote_health=0.5), "eagle"),
    (dict(context_length=2000, batch_size=2), "eagle"),
])
def test_default_rules_over_representative_signals(signals, expected):
    dispatcher = HybridDispatcher(None, ALL, load_signal="load")
    assert dispatcher.choose(StepSignals(**signals)) == expected


@pytest.mark.parametrize("loaded, signals, expected", [
    (("eagle",), dict(context_length=5000, mem_usage=0.5), "eagle"),  # dflash rule skipped
    (("mtp",), dict(context_length=500, batch_size=4), "mtp"),
    (("mtp",), dict(context_length=2000, batch_size=4), "none"),  # no rule for a loaded method holds
    (("dflash", "mtp"), dict(context_length=500, batch_size=16), "none"),
    ((), dict(context_length=500, batch_size=4), "none"),
])
def test_rules_for_methods_that_are_not_loaded_are_skipped(loaded, signals, expected):
    dispatcher = HybridDispatcher(None, loaded)
    assert dispatcher.choose(StepSignals(**signals)) == expected


def test_first_matching_rule_wins_in_file_order(rules_file):
    dispatcher = HybridDispatcher(rules_file, ALL)
    assert dispatcher.choose(StepSignals(context_length=5000, load=0.6)) == "none"  # "none" is always loaded
    assert dispatcher.choose(StepSignals(context_length=5000)) == "dflash"
    assert dispatcher.choose(StepSignals(context_length=500)) == "mtp"
    assert dispatcher.choose(StepSignals(context_length=50)) == "eagle"
    dispatcher.set_loaded_methods(["eagle", "mtp"])
    assert dispatcher.choose(StepSignals(context_length=5000)) == "mtp"


def test_when_less_rules_form_a_preference_list(tmp_path):
    path = tmp_path / "prefs.json"
    write_rules(path, [{"method": "dspark"}, {"method": "dflash"}, {"method": "ngram"}])
    assert HybridDispatcher(path, ["ngram", "dflash"]).choose(StepSignals()) == "dflash"
    assert HybridDispatcher(path, "ngram").choose(StepSignals()) == "ngram"


def test_decisions_are_counted_and_timed():
    dispatcher = HybridDispatcher(None, ALL, load_signal="load")
    for ctx in (5000, 5000, 500, 2000, 2000, 2000):
        dispatcher.choose(StepSignals(context_length=ctx, batch_size=4))
    dispatcher.choose(StepSignals(load=0.9))
    snap = dispatcher.snapshot()
    assert snap.decisions == {"eagle": 3, "mtp": 1, "dflash": 2, "none": 1}
    assert snap.load_fallback_steps == 1 and snap.load_fallback_active and snap.load == 0.9
    assert snap.latency_samples == 7
    assert 0 < snap.latency_p50_ns <= snap.latency_p99_ns
    assert snap.rules_version == 1 and snap.last_reload_error is None


def test_load_fallback_turns_speculation_off_with_hysteresis():
    dispatcher = HybridDispatcher(None, ALL, load_threshold=0.75, load_resume_threshold=0.6,
                                  load_signal="batch_occupancy", max_batch_size=100)
    chosen = [dispatcher.choose(StepSignals(context_length=2000, batch_size=b)) for b in (50, 80, 70, 61, 59, 74)]
    assert chosen == ["eagle", "none", "none", "none", "eagle", "eagle"]
    snap = dispatcher.snapshot()
    assert snap.load_fallback_steps == 3 and snap.load_fallback_engagements == 1
    assert not dispatcher.load_fallback_active


def test_bad_settings_are_refused(tmp_path):
    with pytest.raises(ConfigError, match="unknown method 'hybrid'"):
        HybridDispatcher(None, ["eagle", "hybrid"])
    with pytest.raises(ConfigError, match="hybrid.reload_interval_s"):
        HybridDispatcher(None, ALL, reload_interval_s=-1)
    bad = tmp_path / "bad.json"
    bad.write_text('[{"when": "load >", "method": "eagle"}]')
    with pytest.raises(RuleFileError, match=r"bad.json:1:18: "):
        HybridDispatcher(bad, ALL)


# -- hot reload ----------------------------------------------------------------


def test_editing_the_file_changes_the_choice_without_a_restart(rules_file, caplog):
    dispatcher = HybridDispatcher(rules_file, ALL, reload_interval_s=0)  # poll on every decision
    long_ctx = StepSignals(context_length=5000)
    assert dispatcher.choose(long_ctx) == "dflash"

    write_rules(rules_file, [{"when": "context_length > 1000", "method": "eagle"}, {"method": "mtp"}])
    assert dispatcher.choose(long_ctx) == "eagle"
    assert dispatcher.snapshot().rules_version == 2

    # An invalid edit: the old rules stay, the error is logged and kept, with line and column.
    rules_file.write_text('[\n  {"when": "context_length >> 1000", "method": "dflash"}\n]\n')
    with caplog.at_level(logging.WARNING, logger="hyspec.policy"):
        assert dispatcher.choose(long_ctx) == "eagle"
    err = dispatcher.last_reload_error
    assert (err.line, err.column) == (2, 29)  # the second ">"
    assert "keeping the previous 2 rules" in caplog.text and f"{rules_file}:2:29:" in caplog.text
    snap = dispatcher.snapshot()
    assert snap.reload_failures == 1 and snap.rules_version == 2 and snap.last_reload_error == str(err)

    caplog.clear()  # the same broken file is not re-read or re-logged on every poll
    for _ in range(5):
        dispatcher.choose(long_ctx)
    assert dispatcher.snapshot().reload_failures == 1 and not caplog.records

    write_rules(rules_file, [{"method": "dflash"}])  # fixed: reloads, and the error clears
    assert dispatcher.choose(long_ctx) == "dflash"
    assert dispatcher.last_reload_error is None and dispatcher.snapshot().rules_version == 3


def test_an_atomic_replace_is_seen_and_a_deleted_file_keeps_the_rules(rules_file):
    dispatcher = HybridDispatcher(rules_file, ALL, reload_interval_s=0)
    tmp = rules_file.with_suffix(".tmp")
    write_rules(tmp, [{"when": "context_length > 1000", "method": "mtp"}, {"method": "eagle"}])
    os.replace(tmp, rules_file)  # how editors and config managers save
    assert dispatcher.choose(StepSignals(context_length=5000)) == "mtp"
    rules_file.unlink()
    assert dispatcher.choose(StepSignals(context_length=5000)) == "mtp"
    assert "does not exist" in dispatcher.last_reload_error.message


def test_polling_waits_for_the_interval(rules_file):
    dispatcher = HybridDispatcher(rules_file, ALL, reload_interval_s=3600)
    write_rules(rules_file, [{"method": "mtp"}])
    assert dispatcher.choose(StepSignals(context_length=5000)) == "dflash"  # not polled yet
    assert dispatcher.reload_if_changed()  # an explicit poll sees it
    assert dispatcher.choose(StepSignals(context_length=5000)) == "mtp"


def test_a_background_watcher_reloads_while_choose_runs(rules_file):
    with HybridDispatcher(rules_file, ALL, reload_interval_s=0.01, watch_in_thread=True) as dispatcher:
        signals = StepSignals(context_length=5000)
        assert dispatcher.choose(signals) == "dflash"
        write_rules(rules_file, [{"method": "ngram"}, {"method": "mtp"}])
        deadline = time.monotonic() + 10
        while dispatcher.choose(signals) != "mtp":
            assert time.monotonic() < deadline, "the watcher thread never reloaded the rules"
            time.sleep(0.005)
        rules_file.write_text("not json")
        deadline = time.monotonic() + 10
        while dispatcher.last_reload_error is None:
            assert time.monotonic() < deadline
            time.sleep(0.005)
        assert dispatcher.choose(signals) == "mtp"
        assert "invalid JSON" in dispatcher.last_reload_error.message
    assert dispatcher._thread is None


def test_the_packaged_default_rules_are_not_watched():
    dispatcher = HybridDispatcher(None, ALL, reload_interval_s=0)
    assert not dispatcher.reload_if_changed()
    assert dispatcher.rules_path.name == "default_rules.json"
