"""Canary rollout behind the real server: a stable, hash-chosen share of requests speculates, and the
server's request metrics are labelled by arm, so the A/B comparison comes straight from /metrics."""
from __future__ import annotations

import concurrent.futures
import json
import math

import httpx
import pytest

from hyspec.policy.canary import Canary
from hyspec.engine.engine import LLMEngine
from hyspec.server.async_engine import AsyncEngine, RequestStream
from hyspec.server.metrics import UNASSIGNED, ServerMetrics
from tests.server.conftest import ENGINE_ARGS, engine_of, kv_pool_empty, wait_until
from tests.server.prometheus_text import scrape
from tests.server.spec_serving import NGRAM, PROMPTS, complete_raw, hybrid_config, plain_decoder, write_rules

FRACTION = 0.05
NUM_REQUESTS = 400
MAX_TOKENS = 4  # a spec-arm request drafts at its first decode step; every request has a TPOT
PER_HTTP_REQUEST = 16  # prompts per /v1/completions call: one engine id each (`{response id}-{index}`)
# The arm count is Binomial(n, p) over random request ids: accept within 4 sigma (two-sided miss ~6e-5).
SIGMAS = 4.0


class RecordingProposer:
    """Wraps the engine's ngram proposer and records which requests it was asked to draft for."""

    def __init__(self, inner):
        self.inner = inner
        self.drafted_for: set[str] = set()

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def propose(self, requests, sampling):
        self.drafted_for.update(r.seq.request_id for r in requests)
        return self.inner.propose(requests, sampling)


def test_canary_share_and_metrics_by_arm(make_server, tiny_model_dir, tmp_path):
    rules = tmp_path / "rules.json"
    write_rules(rules, json.dumps([{"method": "ngram"}]))
    # Full batches here: the load fallback (tested in test_hybrid_server) would make every step plain.
    config = hybrid_config(rules, [NGRAM], speculative_fraction=FRACTION, load_threshold=1.0,
                           load_resume_threshold=0.9)
    srv = make_server(engine_overrides={"speculative_config": config}, max_queue=64)
    plain = plain_decoder(tiny_model_dir)
    try:
        spec = engine_of(srv).spec
        recorder = spec.proposers["ngram"] = RecordingProposer(spec.proposers["ngram"])
        prompts = [PROMPTS[i % len(PROMPTS)] for i in range(NUM_REQUESTS)]
        batches = [prompts[i:i + PER_HTTP_REQUEST] for i in range(0, NUM_REQUESTS, PER_HTTP_REQUEST)]
        with httpx.Client(base_url=srv.url, timeout=120) as client:
            with concurrent.futures.ThreadPoolExecutor(4) as pool:
                bodies = list(pool.map(lambda batch: complete_raw(client, batch, MAX_TOKENS), batches))
            m = scrape(client)

        engine_ids, arm_of = [], {}
        for batch, body in zip(batches, bodies):
            for prompt, choice in zip(batch, body["choices"]):
                assert choice["token_ids"] == plain(prompt, MAX_TOKENS), f"{prompt!r} changed under speculation"
                request_id = f"{body['id']}-{choice['index']}"  # how the server names engine requests
                engine_ids.append(request_id)
                arm_of[request_id] = Canary(FRACTION).arm(request_id)
        spec_ids = {r for r, arm in arm_of.items() if arm == "spec"}
        n_spec, n_control = len(spec_ids), NUM_REQUESTS - len(spec_ids)

        # about 5 % speculate
        mean, sd = NUM_REQUESTS * FRACTION, math.sqrt(NUM_REQUESTS * FRACTION * (1 - FRACTION))
        assert abs(n_spec - mean) <= SIGMAS * sd, f"{n_spec} of {NUM_REQUESTS} in the spec arm, expected " \
                                                  f"{mean:.0f} +- {SIGMAS * sd:.1f}"
        # the drafter is asked for spec-arm requests only (each has room to draft at its first decode step)
        assert recorder.drafted_for <= spec_ids, "a control-arm request was speculated"
        assert recorder.drafted_for == spec_ids, "a spec-arm request was never drafted for"

        # the server's request metrics, split by the arm the canary chose: an A/B straight from Prometheus
        arms = {"spec": n_spec, "control": n_control}
        model = {"model_name": "tiny"}
        assert m.by("hyspec_requests_finished_total", "arm", **model, finish_reason="length") == \
            {a: float(n) for a, n in arms.items() if n}
        for arm, n in arms.items():
            labels = {**model, "arm": arm}
            for histogram in ("hyspec_time_to_first_token_seconds", "hyspec_time_per_output_token_seconds",
                              "hyspec_e2e_request_latency_seconds"):
                assert m.value(f"{histogram}_count", 0.0, **labels) == n, (histogram, arm)
                if n:
                    assert m.value(f"{histogram}_bucket", **labels, le="+Inf") == n
                    assert m.value(f"{histogram}_sum", **labels) > 0
            assert m.value("hyspec_generation_tokens_total", 0.0, **labels) == n * MAX_TOKENS
        # the vLLM aliases keep vLLM's labels and count both arms
        assert m.value("vllm:time_to_first_token_seconds_count", **model) == NUM_REQUESTS
        assert m.value("vllm:generation_tokens_total", **model) == NUM_REQUESTS * MAX_TOKENS
        wait_until(lambda: kv_pool_empty(srv), what="the KV pool to empty")
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    return LLMEngine(tiny_model_dir, **ENGINE_ARGS)


class _SpecWithoutDispatcher:
    """An engine.spec that speculates (so requests carry arms) and registers no metrics of its own."""

    enabled = True
    dispatcher = None

    def register_prometheus(self, registry):
        return None


def _ended(reason: str, arm: str | None, output_tokens: int) -> RequestStream:
    s = RequestStream.__new__(RequestStream)  # a stream as it looks when it ends, without an event loop
    s.request_id, s.finish_reason, s.arm = "r", reason, arm
    s.arrival_time, s.first_token_time, s.finish_time = 1.0, 1.5 if output_tokens else None, 2.0
    s.num_prompt_tokens, s.num_output_tokens = (3, output_tokens) if output_tokens else (0, 0)
    return s


def test_arm_labels_only_when_the_engine_speculates(engine, monkeypatch):
    plain_metrics = ServerMetrics(AsyncEngine(engine), "m")
    plain_metrics.observe_request(_ended("length", "spec", 3))  # a plain engine's Sequence defaults to "spec"
    get = plain_metrics.registry.get_sample_value
    assert get("hyspec_time_to_first_token_seconds_count", {"model_name": "m"}) == 1  # no arm label at all

    monkeypatch.setattr(engine, "spec", _SpecWithoutDispatcher())
    metrics = ServerMetrics(AsyncEngine(engine), "m")
    assert metrics.by_arm and metrics.dispatch_collector is None
    metrics.observe_request(_ended("length", "control", 3))
    metrics.observe_request(_ended("rejected", None, 0))  # refused before the canary saw it
    get = metrics.registry.get_sample_value
    assert get("hyspec_time_per_output_token_seconds_count", {"model_name": "m", "arm": "control"}) == 1
    assert get("hyspec_requests_finished_total",
               {"model_name": "m", "arm": UNASSIGNED, "finish_reason": "rejected"}) == 1
    assert get("vllm:time_to_first_token_seconds_count", {"model_name": "m"}) == 1
