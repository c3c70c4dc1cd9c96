"""The real server under trouble: clients that leave (their KV is freed), a failing engine step (500, the
server goes on), a full queue (429), and graceful shutdown (in-flight streams finish, new work gets 503 with
Retry-After; past the shutdown timeout what is left ends in 503 errors, never 500)."""
from __future__ import annotations

import json
import re
import socket
import threading
import time
from contextlib import contextmanager

import httpx

from tests.server.conftest import ENGINE_ARGS, MODEL_NAME, engine_of, kv_pool_empty, wait_until

LONG = {"model": MODEL_NAME, "prompt": "def add(a, b):", "max_tokens": 80, "temperature": 0, "ignore_eos": True}


@contextmanager
def slow_steps(server, seconds: float = 0.02):
    """Make every engine step take at least ``seconds`` (so a request is surely still running when poked)."""
    engine = engine_of(server)
    real_step = engine.step

    def step():
        time.sleep(seconds)
        return real_step()

    engine.step = step  # the engine thread looks the method up on every iteration
    try:
        yield
    finally:
        engine.step = real_step


def counter(server, name: str, **labels: str) -> float:
    text = httpx.get(server.url + "/metrics").text
    total = 0.0
    for line in text.splitlines():
        m = re.match(rf"^{re.escape(name)}\{{(.*)\}} (\S+)$", line)
        if m and all(f'{k}="{v}"' in m.group(1) for k, v in labels.items()):
            total += float(m.group(2))
    return total


def test_a_streaming_client_that_disconnects_frees_its_kv(server):
    aborts = counter(server, "hyspec_requests_finished_total", finish_reason="abort")
    with slow_steps(server):
        with httpx.stream("POST", server.url + "/v1/completions", json={**LONG, "stream": True}, timeout=30) as r:
            assert r.status_code == 200
            events = (line for line in r.iter_lines() if line.startswith("data: "))
            next(events), next(events)  # two chunks, then hang up
            assert not kv_pool_empty(server)  # the request holds KV while it runs
        wait_until(lambda: kv_pool_empty(server), what="the KV pool to empty after the client left")
    assert not engine_of(server).has_unfinished_requests()
    wait_until(lambda: counter(server, "hyspec_requests_finished_total", finish_reason="abort") == aborts + 1,
               what="the abort to be counted")


def test_a_waiting_client_that_disconnects_frees_its_kv(server):
    body = json.dumps(LONG).encode()
    request = (f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\n"
               f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body
    with slow_steps(server):
        sock = socket.create_connection((server.host, server.port))
        sock.sendall(request)
        wait_until(lambda: not kv_pool_empty(server), what="the request to start")
        sock.close()  # gone before the (non-streamed) answer is ready
        wait_until(lambda: kv_pool_empty(server), what="the KV pool to empty after the client left")
    assert not engine_of(server).has_unfinished_requests()


def test_a_failing_step_is_a_500_with_a_message_and_the_server_goes_on(server):
    engine = engine_of(server)
    real_step, failures = engine.step, {"left": 1}

    def failing_step():
        if failures["left"]:
            failures["left"] -= 1
            raise RuntimeError("injected fault")
        return real_step()

    engine.step = failing_step
    try:
        r = httpx.post(server.url + "/v1/completions", json={**LONG, "max_tokens": 4}, timeout=30)
        assert r.status_code == 500
        assert r.json()["error"]["message"] == "engine step failed: RuntimeError: injected fault"
        assert r.json()["error"]["type"] == "server_error"

        failures["left"] = 1
        r = httpx.post(server.url + "/v1/completions", json={**LONG, "max_tokens": 4, "stream": True}, timeout=30)
        assert r.status_code == 200  # the stream started before the step failed: the error comes in it
        events = [e[len("data: "):] for e in r.text.strip().split("\n\n")]
        assert events[-1] == "[DONE]" and json.loads(events[-2])["error"]["code"] == 500
    finally:
        engine.step = real_step
    ok = httpx.post(server.url + "/v1/completions", json={**LONG, "max_tokens": 4}, timeout=30)
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 4
    assert httpx.get(server.url + "/health").json()["status"] == "ok"
    assert kv_pool_empty(server)
    assert counter(server, "hyspec_engine_step_failures_total") == 2


def test_a_full_queue_answers_429(make_server):
    srv = make_server(max_queue=0, engine_overrides={"max_num_seqs": 1})
    try:
        with slow_steps(srv):
            with httpx.stream("POST", srv.url + "/v1/completions", json={**LONG, "stream": True}, timeout=30) as r:
                events = (line for line in r.iter_lines() if line.startswith("data: "))
                next(events)  # keep `events` referenced: a collected generator would close the connection
                busy = httpx.post(srv.url + "/v1/completions", json={**LONG, "max_tokens": 2}, timeout=30)
                assert busy.status_code == 429 and busy.headers["retry-after"] == "1"
                assert "capacity" in busy.json()["error"]["message"]
                two = httpx.post(srv.url + "/v1/completions", json={**LONG, "prompt": ["a", "b"]}, timeout=30)
                assert two.status_code == 400 and "at most 1" in two.json()["error"]["message"]
        ok = httpx.post(srv.url + "/v1/completions", json={**LONG, "max_tokens": 2}, timeout=30)
        assert ok.status_code == 200
    finally:
        srv.stop()


def test_graceful_shutdown_drains_in_flight_streams(make_server):
    srv = make_server(drain_timeout=30)
    results: list[list[str]] = [[] for _ in range(3)]
    started = threading.Barrier(4)

    def client(i: int) -> None:
        with httpx.stream("POST", srv.url + "/v1/completions", timeout=60,
                          json={**LONG, "prompt": f"x{i}", "max_tokens": 40, "stream": True}) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    results[i].append(line[6:])
                    if len(results[i]) == 1:
                        started.wait(timeout=30)

    with slow_steps(srv, 0.03):
        threads = [threading.Thread(target=client, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
        started.wait(timeout=30)  # every stream has its first chunk: now shut down
        stopper = threading.Thread(target=srv.stop)
        stopper.start()
        wait_until(lambda: not srv.app.state.async_engine.accepting, what="the server to start draining")
        assert srv.app.state.async_engine.num_in_flight == 3
        # The listener stays open while the streams drain: new work hears why it is refused.
        assert httpx.get(srv.url + "/health", timeout=5).json()["status"] == "draining"
        late = httpx.post(srv.url + "/v1/completions", json={**LONG, "max_tokens": 2}, timeout=30)
        assert late.status_code == 503 and late.headers["retry-after"] == "1"
        assert "shutting down" in late.json()["error"]["message"]
        for t in threads:
            t.join(60)
        stopper.join(60)
    assert not srv.running and not srv.app.state.async_engine.thread_alive
    for events in results:
        assert events[-1] == "[DONE]"
        chunks = [json.loads(e) for e in events[:-1]]
        assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert kv_pool_empty(srv)


def test_stop_past_the_shutdown_timeout_ends_what_is_left_with_503s(tiny_model_dir, capfd):
    from hyspec.server.app import create_app
    from hyspec.server.launcher import BackgroundServer

    app = create_app({"model": str(tiny_model_dir), **ENGINE_ARGS}, served_model_name=MODEL_NAME)
    srv = BackgroundServer(app, shutdown_timeout=0.2).start()
    answers: dict[str, httpx.Response] = {}
    events: list[str] = []

    def plain() -> None:
        answers["plain"] = httpx.post(srv.url + "/v1/completions", json=LONG, timeout=60)

    def stream() -> None:
        with httpx.stream("POST", srv.url + "/v1/completions", json={**LONG, "stream": True}, timeout=60) as r:
            events.extend(line[6:] for line in r.iter_lines() if line.startswith("data: "))

    with slow_steps(srv, 0.05):  # 80 steps: seconds, far past the timeout
        clients = [threading.Thread(target=plain), threading.Thread(target=stream)]
        for t in clients:
            t.start()
        wait_until(lambda: srv.app.state.async_engine.stats.num_running == 2, what="both requests to run")
        srv.stop()
        for t in clients:
            t.join(60)
    plain_answer = answers["plain"]
    assert plain_answer.status_code == 503 and plain_answer.headers["retry-after"] == "1"
    assert plain_answer.json()["error"]["message"] == "the server shut down before the request finished"
    assert events[-1] == "[DONE]" and json.loads(events[-2])["error"]["code"] == 503
    assert kv_pool_empty(srv) and not srv.app.state.async_engine.thread_alive
    log = capfd.readouterr().err
    assert "Traceback" not in log and "exception was never retrieved" not in log, log[-3000:]
