"""Remote drafting through the engine with in-process workers: identity, faults, failover, metrics.

The workers here are DraftHosts on threads of the test process behind the
same handle contract as Ray actors, so every protocol, timeout and failover
path runs in seconds.  tests/remote/test_ray.py repeats the essentials on a
real local Ray instance.
"""
from __future__ import annotations

import time

import pytest

from hyspec import LLM, SamplingParams
from hyspec.remote.health import DOWN, INCOMPATIBLE, UP
from hyspec.remote.proposer import RemoteProposer
from tests.remote.conftest import MAX_TOKENS, PROMPTS, inprocess_handles, remote_placement, spec_config, token_ids

GREEDY = SamplingParams(temperature=0, max_tokens=MAX_TOKENS)
PATIENT = {"draft_deadline_ms": 5000}  # identity tests want every draft verified, however busy the box


def remote_llm(target_dir, config, make_handles=None):
    with remote_placement(make_handles or inprocess_handles()):
        llm = LLM(str(target_dir), dtype="float32", kv_cache_bytes=8 << 20, speculative_config=config)
    proposer = llm.engine.spec.proposers[config["method"]]
    assert isinstance(proposer, RemoteProposer)
    return llm, proposer


def wait_for(predicate, timeout=5.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.01)
    return False


@pytest.fixture(scope="module")
def shared(target_dir, draft_dir):
    """One remote engine for the tests that leave it as they found it (faults are reset after each)."""
    llm, rp = remote_llm(target_dir, spec_config(model=draft_dir, remote=PATIENT))
    yield llm, rp
    rp.close()


@pytest.fixture
def fresh_metrics(shared):
    """The shared proposer with its remote metrics reset, and no fault left behind."""
    _, rp = shared
    rp.metrics.reset()
    yield shared
    rp.slots[0].handle.set_fault().result(5)


@pytest.mark.parametrize("batch", [1, 8])
def test_greedy_identical_to_plain(fresh_metrics, plain_outputs, batch):
    llm, rp = fresh_metrics
    n = 3 if batch == 1 else len(PROMPTS)  # bs 1 on a few prompts: the slow half of the matrix
    for i in range(0, n, batch):
        assert token_ids(llm.generate(PROMPTS[i:i + batch], GREEDY)) == plain_outputs[i:i + batch]
    snap = rp.metrics.snapshot()
    assert snap["drafts"]["remote"] + snap["drafts"]["pipelined"] > 0 and snap["drafts"]["fallback"] == 0
    assert llm.engine.spec.metrics.snapshot()["totals"]["draft_tokens"] > 0
    assert snap["bytes_per_step"] > 0 and snap["rtt_seconds"]["count"] == snap["calls"]
    pool = llm.engine.pool
    pool.assert_all_free()  # target and the local failover drafter; workers keep their KV in their own process
    assert rp.health() == 1.0


def test_self_draft_pipelines_most_steps(target_dir, plain_outputs):
    """The target drafting for itself accepts everything, so the pipelined hypothesis nearly always holds."""
    llm, rp = remote_llm(target_dir, spec_config(model=target_dir, k=4, remote=PATIENT))
    try:
        assert token_ids(llm.generate(PROMPTS, GREEDY)) == plain_outputs
        t = llm.engine.spec.metrics.snapshot()["totals"]
        assert t["accepted_tokens"] == t["draft_tokens"] > 0
        drafts = rp.metrics.snapshot()["drafts"]
        assert drafts["pipelined"] > drafts["remote"]
    finally:
        rp.close()


def test_without_pipelining_nothing_is_pipelined(target_dir, draft_dir, plain_outputs):
    llm, rp = remote_llm(target_dir, spec_config(model=draft_dir, remote={**PATIENT, "pipelining": False}))
    try:
        assert token_ids(llm.generate(PROMPTS, GREEDY)) == plain_outputs
        assert rp.metrics.snapshot()["drafts"]["pipelined"] == 0
    finally:
        rp.close()


def test_sampled_requests_are_drafted_remotely(fresh_metrics):
    """Verified as point proposals (the default): no q crosses the wire, so none can be garbled either."""
    llm, rp = fresh_metrics
    drafted = llm.engine.spec.metrics.snapshot()["totals"]["draft_tokens"]
    params = [SamplingParams(temperature=0.8, top_k=k, seed=i, max_tokens=24, ignore_eos=True)
              for i, k in enumerate([0, 20] * 4)]
    outs = llm.generate(PROMPTS, params)
    assert all(len(o.outputs[0].token_ids) == 24 for o in outs)
    snap = rp.metrics.snapshot()
    assert snap["drafts"]["remote"] + snap["drafts"]["pipelined"] > 0 and not snap["invalid_drafts"]
    assert llm.engine.spec.metrics.snapshot()["totals"]["draft_tokens"] > drafted


@pytest.mark.parametrize("timed", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["counts", "wall-clock"])
def test_slow_worker_times_out_to_plain_steps(target_dir, draft_dir, plain_outputs, timed):
    """Counts and states in the default run; the wall-clock bound (1.5x plain + 1.5x the deadlines waited
    + 0.5 s) only in the slow tier, where a loaded 2-core box cannot make it flake the default run."""
    deadline_ms = 30
    plain = LLM(str(target_dir), dtype="float32", kv_cache_bytes=8 << 20)
    t = time.perf_counter()
    plain.generate(PROMPTS, GREEDY)
    plain_seconds = time.perf_counter() - t

    llm, rp = remote_llm(target_dir, spec_config(model=draft_dir, remote={"draft_deadline_ms": deadline_ms}))
    try:
        rp.slots[0].handle.set_fault(delay_ms=150).result(5)
        t = time.perf_counter()
        assert token_ids(llm.generate(PROMPTS, GREEDY)) == plain_outputs
        seconds = time.perf_counter() - t
        snap = rp.metrics.snapshot()
        lost = llm.engine.spec.metrics.snapshot()["totals"]["rejections"].get("draft_timeout", 0)
        assert snap["draft_timeouts"] == lost > 0
        assert rp.slots[0].state == UP  # slow is not dead: pings still answer
        # Each call waits at most one deadline; while a late call runs, its sequences skip drafting (no wait).
        waits = snap["calls"]
        if timed:
            assert seconds <= plain_seconds * 1.5 + waits * deadline_ms / 1000 * 1.5 + 0.5, (seconds, plain_seconds,
                                                                                           waits)
    finally:
        rp.close()


@pytest.mark.parametrize("kind", ["lengths", "ids", "stale", "bytes", "nan"])
def test_garbage_is_counted_and_the_step_falls_back(fresh_metrics, plain_outputs, kind):
    llm, rp = fresh_metrics
    rp.slots[0].handle.set_fault(garbage=kind).result(5)
    if kind == "nan":  # q is read for sampled requests only
        params = [SamplingParams(temperature=0.8, seed=i, max_tokens=16, ignore_eos=True) for i in range(4)]
        outs = llm.generate(PROMPTS[:4], params)
        assert all(len(o.outputs[0].token_ids) == 16 for o in outs)
        expected_kind = "probs"
    else:
        assert token_ids(llm.generate(PROMPTS[:4], GREEDY)) == plain_outputs[:4]
        expected_kind = {"lengths": "length", "ids": "vocab", "stale": "stale", "bytes": "bytes"}[kind]
    snap = rp.metrics.snapshot()
    assert snap["invalid_drafts"].get(expected_kind, 0) > 0, snap["invalid_drafts"]
    assert snap["drafts"]["remote"] + snap["drafts"]["pipelined"] == 0  # nothing garbled got through


def settle(slot) -> None:
    """Let the ping in flight answer (or fail) before the next tick reads it: ticks then count, not race."""
    pending = slot._ping
    if pending is not None:
        try:
            pending.result(5)
        except Exception:
            pass


def tick_until(monitor, slot, predicate, max_ticks: int) -> int:
    """Drive the health monitor by hand; how many ticks until ``predicate()`` (fails past ``max_ticks``)."""
    for ticks in range(1, max_ticks + 1):
        settle(slot)
        monitor.tick(slot)
        if predicate():
            return ticks
    raise AssertionError(f"not reached in {max_ticks} health ticks (state {slot.state})")


@pytest.mark.parametrize("fallback", ["ngram", "none"])
def test_killed_worker_fails_over_and_rejoins(target_dir, draft_dir, plain_outputs, fallback):
    """The health monitor's thread is stopped and its ticks driven by the test, so the failover and the
    rejoin happen at fixed points of the run: detection within max_missed ticks (ticks x ping interval
    is the detection time; 3 x 50 ms here), rejoin after rejoin_after good answers."""
    cfg = spec_config(model=draft_dir, remote={**PATIENT, "fallback_method": fallback, "ping_interval_ms": 50})
    llm, rp = remote_llm(target_dir, cfg)
    try:
        engine, slot, monitor = llm.engine, rp.slots[0], rp.monitor
        monitor.stop()
        for p in PROMPTS:
            engine.add_request(p, GREEDY)
        outs: dict[str, list[int]] = {}
        steps = 0
        while engine.has_unfinished_requests():
            for o in engine.step():
                if o.finished:
                    outs[o.request_id] = o.outputs[0].token_ids
            steps += 1
            if steps == 5:
                slot.handle.kill()
                ticks = tick_until(monitor, slot, lambda: slot.state == DOWN, monitor.max_missed + 1)
                assert ticks <= monitor.max_missed + 1
                assert ticks * monitor.interval_s <= 1.0  # the detection time these settings promise
        assert [outs[str(i)] for i in range(len(PROMPTS))] == plain_outputs
        snap = rp.metrics.snapshot()
        assert snap["failovers"] == 1 and rp.health() == 0.0
        if fallback == "ngram":
            assert snap["drafts"]["fallback"] > 0
        slot.handle.restart()  # like Ray restarting the actor: a new incarnation, empty state
        tick_until(monitor, slot, lambda: slot.state == UP, monitor.rejoin_after + 3)
        before = snap["drafts"]["remote"] + snap["drafts"]["pipelined"]
        assert token_ids(llm.generate(PROMPTS, GREEDY)) == plain_outputs
        snap = rp.metrics.snapshot()
        assert snap["rejoins"] == 1 and snap["drafts"]["remote"] + snap["drafts"]["pipelined"] > before
    finally:
        rp.close()


@pytest.mark.slow
def test_killed_worker_is_detected_within_a_second_on_the_real_clock(target_dir, draft_dir, plain_outputs):
    """The health thread on the wall clock: declared down within 1 s of the kill (3 missed 50 ms pings:
    0.15 s nominal, so the margin is ~6x for a loaded box)."""
    cfg = spec_config(model=draft_dir, remote={**PATIENT, "fallback_method": "ngram", "ping_interval_ms": 50})
    llm, rp = remote_llm(target_dir, cfg)
    try:
        slot = rp.slots[0]
        assert wait_for(lambda: slot.state == UP, timeout=5.0)
        slot.handle.kill()
        killed_at = time.monotonic()
        assert wait_for(lambda: slot.state == DOWN, timeout=5.0)
        assert slot.down_at - killed_at <= 1.0
        assert token_ids(llm.generate(PROMPTS, GREEDY)) == plain_outputs
    finally:
        rp.close()


def test_drafter_for_another_target_is_refused(target_dir, foreign_draft_dir, plain_outputs):
    llm, rp = remote_llm(target_dir, spec_config(model=foreign_draft_dir, remote=PATIENT),
                         inprocess_handles(model_override=foreign_draft_dir))
    try:
        assert rp.slots[0].state == INCOMPATIBLE and "tokenizer" in rp.slots[0].problem
        assert token_ids(llm.generate(PROMPTS, GREEDY)) == plain_outputs
        snap = rp.metrics.snapshot()
        assert snap["incompatible_workers"] == 1 and snap["calls"] == 0 and snap["drafts"]["fallback"] > 0
        assert rp.health() == 0.0
    finally:
        rp.close()


@pytest.mark.parametrize("timed", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["counts", "wall-clock"])
def test_unreachable_ray_address_drafts_locally(target_dir, draft_dir, plain_outputs, timed):
    """The engine comes up drafting locally; the slow tier also holds start-up under 30 s (the TCP check
    answers in milliseconds, the rest is loading the tiny target and drafter: ~1 s here)."""
    t = time.perf_counter()
    with remote_placement():  # real Ray path: the TCP check fails before ray.init is tried
        llm = LLM(str(target_dir), dtype="float32", kv_cache_bytes=8 << 20,
                  speculative_config=spec_config(model=draft_dir, ray_address="127.0.0.1:1"))
    if timed:
        assert time.perf_counter() - t < 30
    rp = llm.engine.spec.proposers["draft_model"]
    try:
        assert rp.slots == [] and rp.health() == 0.0
        assert token_ids(llm.generate(PROMPTS, GREEDY)) == plain_outputs
        snap = rp.metrics.snapshot()
        assert snap["connect_failures"] == 1 and snap["drafts"]["fallback"] > 0
    finally:
        rp.close()


class LostCall:
    """A draft call that never arrives: never done, and a wait for it times out at once."""

    def done(self) -> bool:
        return False

    def result(self, timeout):
        raise TimeoutError("lost")


class ShiftedClock:
    """``time`` for the remote proposer, with a hand the test moves forward instead of sleeping."""

    def __init__(self):
        self.offset = 0.0

    def perf_counter(self) -> float:
        return time.perf_counter() + self.offset

    def monotonic(self) -> float:
        return time.monotonic() + self.offset


def test_lost_message_is_resynced(target_dir, draft_dir, plain_outputs, monkeypatch):
    """A call that never arrives leaves a gap: the worker asks for the history again and drafting resumes.

    The proposer's clock is injected: the lost call is given up on by moving the clock past the
    abandonment point, not by sleeping, and the deadline is patient, so every other answer arrives
    in time whatever the machine's load.
    """
    import hyspec.remote.proposer as proposer_module
    from hyspec.remote.proposer import ABANDON_LATE_CALL_DEADLINES

    clock = ShiftedClock()
    monkeypatch.setattr(proposer_module, "time", clock)
    llm, rp = remote_llm(target_dir, spec_config(model=draft_dir, remote={**PATIENT, "pipelining": False}))
    try:
        engine, handle = llm.engine, rp.slots[0].handle
        deliver, calls = handle.draft, []

        def lossy(payload):
            calls.append(payload)
            return LostCall() if len(calls) == 3 else deliver(payload)  # call 3 is lost

        handle.draft = lossy
        for p in PROMPTS[:2]:
            engine.add_request(p, GREEDY)
        outs, resynced_at = {}, None
        while engine.has_unfinished_requests():
            n = len(calls)
            for o in engine.step():
                if o.finished:
                    outs[o.request_id] = o.outputs[0].token_ids
            if n < 3 <= len(calls):  # the lost call went out this step: move past its abandonment
                clock.offset += (ABANDON_LATE_CALL_DEADLINES + 1) * rp.deadline_s
            snap = rp.metrics.snapshot()
            if resynced_at is None and snap["resyncs"]:
                resynced_at = snap["drafts"]["remote"]
        assert [outs["0"], outs["1"]] == plain_outputs[:2]
        assert handle.host.gaps >= 1  # the worker saw the gap the lost call left and asked for the history
        snap = rp.metrics.snapshot()
        assert snap["draft_timeouts"] >= 1  # the lost call's sequences, counted once each
        assert resynced_at is not None, "no resync happened after the lost call"
        assert snap["drafts"]["remote"] > resynced_at, "drafting did not resume after the resync"
    finally:
        rp.close()


def test_prometheus_families(fresh_metrics):
    from prometheus_client import CollectorRegistry, generate_latest

    llm, rp = fresh_metrics
    llm.generate(PROMPTS[:2], GREEDY)
    assert wait_for(lambda: rp.metrics.snapshot()["workers"].get(rp.slots[0].name, {}).get("threads"))
    registry = CollectorRegistry()
    rp.register_prometheus(registry)
    text = generate_latest(registry).decode()
    for name in ("hyspec_remote_rtt_seconds_bucket", "hyspec_remote_bytes_sent_total",
                 "hyspec_remote_draft_timeouts_total", "hyspec_remote_failovers_total",
                 "hyspec_remote_worker_cpu_utilisation", "hyspec_remote_health"):
        assert name in text, name


def test_the_engines_metrics_include_remote_drafting(fresh_metrics):
    """What a server exports (engine.spec.register_prometheus) carries the remote families too."""
    from prometheus_client import CollectorRegistry, generate_latest

    llm, rp = fresh_metrics
    llm.generate(PROMPTS[:2], GREEDY)
    registry = CollectorRegistry()
    llm.engine.spec.register_prometheus(registry)
    text = generate_latest(registry).decode()
    assert 'hyspec_remote_calls_total{method="draft_model"}' in text
    assert "hyspec_spec_draft_tokens_total" in text


def test_several_remote_methods_share_one_family_per_metric():
    """A hybrid whose methods all draft remotely: one family per metric, one sample per method."""
    from prometheus_client import CollectorRegistry, generate_latest

    from hyspec.remote.metrics import RemoteMetrics

    registry = CollectorRegistry()
    a, b = RemoteMetrics("ngram"), RemoteMetrics("eagle3")
    a.add("calls", 3)
    b.add("calls", 5)
    a.register_prometheus(registry)
    b.register_prometheus(registry)
    text = generate_latest(registry).decode()
    assert text.count("# HELP hyspec_remote_calls_total") == 1
    assert 'hyspec_remote_calls_total{method="ngram"} 3.0' in text
    assert 'hyspec_remote_calls_total{method="eagle3"} 5.0' in text


def test_dropping_the_engine_stops_the_health_thread(target_dir, draft_dir):
    import gc
    import threading

    llm, rp = remote_llm(target_dir, spec_config(model=draft_dir))
    finalizer, host, thread = rp._finalizer, rp.slots[0].handle, rp.monitor._thread
    assert thread in threading.enumerate()
    del llm, rp
    gc.collect()
    assert not finalizer.alive  # the collector ran the shutdown (on a thread of its own: proposer._shutdown_soon)
    assert wait_for(lambda: not host.alive)  # workers closed, no engine left holding them
    assert wait_for(lambda: not thread.is_alive())


def test_collector_shutdown_on_the_health_thread_does_not_wait_on_a_lock_it_holds():
    """The hang once seen: the proposer collected inside its health thread's pool submit, pool lock held."""
    import threading

    from hyspec.remote.proposer import _shutdown_soon

    lock = threading.Lock()
    closed = threading.Event()

    class Handle:
        def close(self):
            with lock:  # what ThreadPoolExecutor.shutdown takes, held by the thread the collector runs on
                closed.set()

    class Monitor:
        _thread = None

        def stop(self):
            pass

    monitor = Monitor()
    returned = threading.Event()

    def health_thread():
        with lock:
            _shutdown_soon(monitor, [Handle()], None)
            returned.set()

    thread = threading.Thread(target=health_thread)
    monitor._thread = thread
    thread.start()
    thread.join(timeout=10)
    assert returned.is_set() and not thread.is_alive(), "the shutdown waited on the lock its own thread held"
    assert closed.wait(10), "the deferred shutdown never closed the worker"


def test_a_prefilling_request_is_warmed_on_a_worker_with_the_next_draft_call(fresh_metrics):
    """The strategy tells proposers which requests prefill this step (Proposer.on_prefill); the remote
    proposer sends such a request's history, budget 0, with the call it makes for the decoding ones."""
    llm, rp = fresh_metrics
    engine = llm.engine
    updates = []
    real = rp._build_call

    def spy(slot, idx, requests):
        call = real(slot, idx, requests)
        updates.extend((u.rid, u.budget, len(u.tokens)) for u in call.updates)
        return call

    rp._build_call = spy
    try:
        engine.add_request(PROMPTS[0], GREEDY, request_id="warm-a")
        while not any(rid == "warm-a" and budget > 0 for rid, budget, _ in updates):
            engine.step()  # until "warm-a" decodes and drafts remotely
        engine.add_request(PROMPTS[1], GREEDY, request_id="warm-b")
        engine.step()  # warm-b's prompt is prefilled in the step warm-a drafts in
        while engine.has_unfinished_requests():
            engine.step()
    finally:
        rp._build_call = real
    warm = [(budget, n) for rid, budget, n in updates if rid == "warm-b"]
    assert warm and warm[0] == (0, len(engine.tokenizer.encode(PROMPTS[1]))), updates
    engine.pool.assert_all_free()
