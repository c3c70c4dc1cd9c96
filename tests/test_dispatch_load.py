"""Load-based fallback: hysteresis and the configurable load figure."""
from __future__ import annotations

import pytest

from hyspec.policy.load import LoadFallback
from hyspec.policy.signals import StepSignals
from hyspec.errors import ConfigError


def test_hysteresis_engages_above_the_threshold_and_releases_only_below_the_resume_threshold():
    fallback = LoadFallback(threshold=0.75, resume_threshold=0.6, signal="load")
    loads = [0.5, 0.75, 0.76, 0.7, 0.61, 0.6, 0.59, 0.7, 0.75, 0.751, 0.2]
    active = [fallback.update(StepSignals(load=x)) for x in loads]
    # 0.75 does not exceed 0.75; 0.6 is not below 0.6
    assert active == [False, False, True, True, True, True, False, False, False, True, False]
    assert fallback.engagements == 2
    assert fallback.last_load == 0.2 and not fallback.active


@pytest.mark.parametrize("signal, kwargs, signals, expected", [
    ("load", {}, dict(load=0.3, mem_usage=0.9), 0.3),
    ("kv_usage", {}, dict(load=0.3, mem_usage=0.9), 0.9),
    ("batch_occupancy", dict(max_batch_size=32), dict(batch_size=24), 0.75),
    ("batch_occupancy", dict(max_batch_size=32), dict(batch_size=40), 1.0),  # capped
    ("queue_depth", dict(queue_capacity=10), dict(queue_depth=5), 0.5),
    ("queue_depth", dict(queue_capacity=10), dict(queue_depth=50), 1.0),
    ("max", dict(max_batch_size=8, queue_capacity=100), dict(batch_size=2, mem_usage=0.4, queue_depth=90), 0.9),
    ("max", dict(max_batch_size=8), dict(batch_size=7, mem_usage=0.4, queue_depth=90, load=0.1), 0.875),
    ("max", {}, dict(batch_size=64, mem_usage=0.4, queue_depth=90, load=0.1), 0.4),  # no normalisers
])
def test_load_signals(signal, kwargs, signals, expected):
    assert LoadFallback(signal=signal, **kwargs).measure(StepSignals(**signals)) == pytest.approx(expected)


def test_kv_usage_drives_the_fallback():
    fallback = LoadFallback(signal="kv_usage")
    assert fallback.update(StepSignals(mem_usage=0.8, load=0.0))
    assert not fallback.update(StepSignals(mem_usage=0.5, load=1.0))


@pytest.mark.parametrize("kwargs, key", [
    (dict(threshold=0.0), "hybrid.load_threshold"),
    (dict(threshold=1.2), "hybrid.load_threshold"),
    (dict(threshold=0.6, resume_threshold=0.6), "hybrid.load_resume_threshold"),
    (dict(resume_threshold=-0.1), "hybrid.load_resume_threshold"),
    (dict(signal="cpu"), "hybrid.load_signal"),
    (dict(signal="batch_occupancy"), "hybrid.load_signal"),
    (dict(signal="queue_depth"), "hybrid.load_signal"),
    (dict(max_batch_size=0), "hybrid.max_batch_size"),
    (dict(queue_capacity=0), "hybrid.queue_capacity"),
])
def test_bad_settings_name_their_key(kwargs, key):
    with pytest.raises(ConfigError) as info:
        LoadFallback(**kwargs)
    assert info.value.key == key
