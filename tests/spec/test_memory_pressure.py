"""Drafters under KV memory pressure, the TTFT SLO switch and the pool's fragmentation monitor: each
changes when hyspec speculates or how pages are held, never the tokens."""
from __future__ import annotations

import logging

import pytest

from hyspec import LLM, SamplingParams
from hyspec.errors import ConfigError
from hyspec.spec.config import SpeculativeConfig
from tests.spec.conftest import PROMPTS

LONG = SamplingParams(temperature=0, max_tokens=60)  # as plain_outputs


class FakeClock:
    """Advances 10 ms per reading (one reading per engine step): windows and cool-downs in steps, not in
    this VM's timing."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        self.now += 0.01
        return self.now


def _draft_llm(target_dir, draft_dir, kv_bytes, **pressure):
    cfg = {"method": "draft_model", "model": str(draft_dir), "num_speculative_tokens": 3,
           "controller": {"enabled": False, "profile_at_startup": False},
           "memory_pressure": {"window_s": 0.02, "cooldown_s": 60.0, **pressure}}
    llm = LLM(str(target_dir), dtype="float32", kv_cache_bytes=kv_bytes, speculative_config=cfg)
    llm.engine.spec.residency.clock = FakeClock()
    return llm


def _plain(target_dir, kv_bytes):
    return LLM(str(target_dir), dtype="float32", kv_cache_bytes=kv_bytes)


def _kv_bytes_for(target_dir, tokens: int) -> int:
    """A pool holding about ``tokens`` target tokens (plus the drafter's share of the same pages)."""
    llm = _plain(target_dir, 8 << 20)
    return llm.engine.pool.page_bytes * (-(-tokens // llm.engine.layout.block_size))


def test_pressure_releases_the_drafter_plainly_and_it_comes_back(target_dir, draft_dir, plain_outputs):
    kv = _kv_bytes_for(target_dir, 4 * 80)  # 8 requests of ~70 tokens cannot all fit: pressure
    llm = _draft_llm(target_dir, draft_dir, kv)
    engine, spec = llm.engine, llm.engine.spec
    ops = spec.metrics.ops
    assert ops.snapshot()["resident"] == {"draft_model": True}
    outs = llm.generate(PROMPTS, LONG)
    assert [o.outputs[0].token_ids for o in outs] == plain_outputs  # lossless through the release
    snap = ops.snapshot()
    assert snap["transitions"].get("draft_model:released") == 1 and snap["resident"] == {"draft_model": False}
    assert "draft_model" not in spec.proposers
    assert spec.metrics.snapshot()["methods"]["draft_model"]["spec"]["rejections"]["memory_pressure"] > 0
    engine.pool.assert_all_free()
    assert engine.pool.pages_by_owner().get("draft_model", 0) == 0  # its KV pages are the pool's again

    spec.residency.clock.now += 61  # the cool-down passes without pressure
    before = spec.metrics.snapshot()["totals"]["draft_tokens"]
    out = llm.generate(PROMPTS[:1], LONG)[0]
    assert out.outputs[0].token_ids == plain_outputs[0]
    snap = ops.snapshot()
    assert snap["transitions"].get("draft_model:reloaded") == 1 and snap["resident"] == {"draft_model": True}
    assert spec.metrics.snapshot()["totals"]["draft_tokens"] > before  # it drafts again
    engine.pool.assert_all_free()


def test_a_failed_reload_stays_plain_and_retries(target_dir, draft_dir, plain_outputs, monkeypatch, caplog):
    kv = _kv_bytes_for(target_dir, 4 * 80)
    llm = _draft_llm(target_dir, draft_dir, kv)
    llm.generate(PROMPTS, LONG)
    clock = llm.engine.spec.residency.clock
    import hyspec.spec.decoder as decoder

    real, calls = decoder.build_proposer, []

    def flaky(target, spec):
        calls.append(spec.method)
        if len(calls) == 1:
            raise OSError("drafter weights unreadable")
        return real(target, spec)

    monkeypatch.setattr(decoder, "build_proposer", flaky)
    clock.now += 61
    with caplog.at_level(logging.WARNING, logger="hyspec.policy.residency"):
        first = llm.generate(PROMPTS[:1], LONG)[0]
    assert "reloading the draft_model drafter failed (OSError: drafter weights unreadable)" in caplog.text
    assert first.outputs[0].token_ids == plain_outputs[0]
    clock.now += 61
    second = llm.generate(PROMPTS[1:2], LONG)[0]
    assert second.outputs[0].token_ids == plain_outputs[1]
    snap = llm.engine.spec.metrics.ops.snapshot()
    assert snap["transitions"]["draft_model:reload_failed"] == 1 and snap["transitions"]["draft_model:reloaded"] == 1
    assert calls == ["draft_model", "draft_model"]  # retried one cool-down after the failure


def test_without_pressure_nothing_is_released(target_dir, draft_dir, plain_outputs):
    llm = _draft_llm(target_dir, draft_dir, 8 << 20, free_floor=0.0)
    outs = llm.generate(PROMPTS[:2], LONG)
    assert [o.outputs[0].token_ids for o in outs] == plain_outputs[:2]
    snap = llm.engine.spec.metrics.ops.snapshot()
    assert snap["resident"] == {"draft_model": True}
    assert set(snap["transitions"].values()) == {0}  # the series exist from the start, at 0


def test_remote_drafting_under_pressure_touches_nothing(caplog):
    from hyspec.spec.metrics import SpecMetrics
    from hyspec.spec.ops_config import MemoryPressureConfig
    from hyspec.policy.residency import DrafterResidency

    clock = [0.0]
    r = DrafterResidency(MemoryPressureConfig(window_s=1.0), SpecMetrics(), remote=True, clock=lambda: clock[0])
    released = []
    with caplog.at_level(logging.INFO, logger="hyspec.policy.residency"):
        for t in range(5):
            clock[0] = float(t)
            r.step(True, {"draft_model": object()}, released.append, released.append)
    assert released == []
    assert caplog.text.count("local memory is unaffected") == 1


def test_least_useful_drafter_goes_first():
    import torch

    from hyspec.spec.metrics import SpecMetrics
    from hyspec.spec.ops_config import MemoryPressureConfig
    from hyspec.policy.residency import DrafterResidency

    class Holder:
        def __init__(self):
            self.model = torch.nn.Linear(2, 2)

    metrics = SpecMetrics()
    metrics.record_step("eagle", "spec", 4, 12, [4, 3, 2], {}, 0.01, 0.05)  # 13 tokens in 0.06 s
    metrics.record_step("mtp", "spec", 4, 12, [1, 0, 0], {}, 0.01, 0.05)  # 5 tokens in 0.06 s
    clock = [0.0]
    r = DrafterResidency(MemoryPressureConfig(window_s=1.0), metrics, clock=lambda: clock[0])
    released = []
    for t in (0.0, 1.5, 3.0):
        clock[0] = t
        r.step(True, {"eagle": Holder(), "mtp": Holder(), "ngram": object()}, released.append, released.append)
    assert released == ["mtp", "eagle"]  # ngram holds nothing to release


@pytest.mark.parametrize("section, key, value, message", [
    ("memory_pressure", "window_s", 0, "must be > 0.0"),
    ("memory_pressure", "cooldown_s", -1, "must be > 0.0"),
    ("memory_pressure", "free_floor", 1.5, "must be <= 0.99"),
    ("slo", "ttft_p99_ms", 0, "must be > 0.0"),
    ("slo", "window_s", 0, "must be > 0.0"),
    ("slo", "resume_fraction", 1.0, "must be < 1"),
])
def test_bad_thresholds_and_windows_name_the_key(section, key, value, message):
    with pytest.raises(ConfigError, match=rf"speculative_config\.{section}\.{key}: {message}"):
        SpeculativeConfig.from_dict({"method": "ngram", section: {key: value}})


def test_ttft_guard_switches_with_hysteresis():
    from hyspec.spec.ops_config import SLOConfig
    from hyspec.spec.ops_metrics import OperatorMetrics
    from hyspec.policy.slo import TTFTGuard

    clock = [0.0]
    ops = OperatorMetrics()
    g = TTFTGuard(SLOConfig(ttft_p99_ms=300, window_s=10, min_samples=3, resume_fraction=0.8), ops,
                  clock=lambda: clock[0])
    for t in (0.1, 0.2, 0.5):  # p99 = 0.5 s > 0.3 s
        g.observe(t)
    assert g.speculation_off() and ops.snapshot()["fallback"]["ttft_slo"]
    clock[0] = 11.0  # the slow ones leave the window
    for t in (0.25, 0.26, 0.27):  # p99 0.27 s: under the ceiling but above 0.8 x 0.3 = 0.24 s
        g.observe(t)
    assert g.speculation_off()
    clock[0] = 22.0
    for t in (0.1, 0.1, 0.2):
        g.observe(t)
    assert not g.speculation_off() and not ops.snapshot()["fallback"]["ttft_slo"]


def test_a_breached_ttft_objective_makes_steps_plain(target_dir, plain_outputs):
    cfg = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 2,
           "slo": {"ttft_p99_ms": 0.001, "min_samples": 1}}  # any real TTFT breaches 1 us
    llm = LLM(str(target_dir), dtype="float32", kv_cache_bytes=8 << 20, speculative_config=cfg)
    first = llm.generate(PROMPTS[:1], LONG)[0]
    drafted = llm.engine.spec.metrics.snapshot()["totals"]["draft_tokens"]
    second = llm.generate(PROMPTS[1:2], LONG)[0]
    snap = llm.engine.spec.metrics.snapshot()
    assert [first.outputs[0].token_ids, second.outputs[0].token_ids] == plain_outputs[:2]
    assert snap["totals"]["draft_tokens"] == drafted  # nothing drafted once the objective was breached
    assert snap["totals"]["rejections"]["ttft_slo"] > 0
    assert llm.engine.spec.metrics.ops.snapshot()["ttft_p99_seconds"] > 0


def test_fragmentation_is_measured_and_compacted(target_dir, plain_outputs):
    llm = LLM(str(target_dir), dtype="float32", kv_cache_bytes=8 << 20, fragmentation_window_s=0.001)
    engine = llm.engine
    ids = [engine.add_request(p, LONG).request_id for p in PROMPTS[:4]]
    engine.step()  # prefilled: each sequence holds the pages of its prompt
    bs = engine.layout.block_size
    for seq in list(engine.scheduler.running):  # fragmentation on purpose: reservations never consumed
        seq.kv.reserve(seq.kv.num_tokens + 6 * bs)
    from hyspec.kv.fragmentation import fragmentation_index

    assert fragmentation_index(engine.pool) > 1.2
    outs = {}
    while engine.has_unfinished_requests():
        for o in engine.step():
            if o.finished:
                outs[o.request_id] = o.outputs[0].token_ids
    assert [outs[i] for i in ids] == plain_outputs[:4]
    assert engine.fragmentation.compactions >= 1 and engine.fragmentation.pages_compacted >= 4 * 6 - 4
    engine.pool.assert_all_free()


@pytest.mark.parametrize("kwargs, key", [({"fragmentation_threshold": 1.0}, "fragmentation_threshold"),
                                         ({"fragmentation_window_s": 0}, "fragmentation_window_s")])
def test_bad_fragmentation_settings_name_the_key(target_dir, kwargs, key):
    with pytest.raises(ConfigError, match=key):
        LLM(str(target_dir), dtype="float32", kv_cache_bytes=8 << 20, **kwargs)
