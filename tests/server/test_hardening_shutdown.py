"""`hyspec serve` stopped while it works (issue 50, item 2): SIGTERM past --shutdown-timeout never answers 500,
new requests get 503 with Retry-After while the drain runs, every stream ends with an error event or its last
chunk and then [DONE], and neither that nor a client that hangs up leaves a traceback in the server's log.

The server is a real process on 127.0.0.1 around the tiny checkpoint with a long context, so that its
requests (ignore_eos, thousands of tokens) surely outlive a one-second --shutdown-timeout."""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from hyspec.bench.serve_process import free_port, wait_until_healthy

CONTEXT = 4096  # tokens: thousands of tiny-model steps, seconds of work whatever the machine
LONG = {"model": "tiny", "prompt": "def add(a, b):", "max_tokens": CONTEXT - 64, "temperature": 0, "ignore_eos": True}
TWO_SAMPLES = {"n": 2, "temperature": 1.0}  # two engine requests whose reads fail together at the abort
LOG_FAULTS = ("Traceback", "Exception in ASGI application", "exception was never retrieved")


@pytest.fixture(scope="module")
def long_context_model(tiny_model_dir, tmp_path_factory) -> Path:
    """The tiny checkpoint with a context long enough for requests that take seconds (RoPE has no limit)."""
    path = tmp_path_factory.mktemp("shutdown_model") / "tiny"
    shutil.copytree(tiny_model_dir, path)
    config = json.loads((path / "config.json").read_text())
    config["max_position_embeddings"] = CONTEXT
    (path / "config.json").write_text(json.dumps(config))
    return path


@contextmanager
def serve(model: Path, log_path: Path, shutdown_timeout: float) -> Iterator[tuple[subprocess.Popen, str]]:
    """A `hyspec serve` process (its log in ``log_path``), up and healthy; killed if the test leaves it running."""
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}
    env.pop("HYSPEC_API_KEY", None)
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "hyspec.cli.main", "serve", "--model", str(model), "--port", str(port),
             "--backend", "cpu", "--dtype", "float32", "--kv-cache-bytes", "64MiB", "--max-model-len", str(CONTEXT),
             "--max-num-seqs", "8", "--served-model-name", "tiny", "--log-level", "info",
             "--shutdown-timeout", str(shutdown_timeout)],
            stdout=log, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_healthy(url, proc, 120, log_tail=lambda: ":\n" + log_path.read_text()[-3000:])
        yield proc, url
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def gauge(url: str, name: str) -> float:
    match = re.search(rf"^{re.escape(name)}\{{[^}}]*\}} (\S+)$", httpx.get(url + "/metrics").text, re.MULTILINE)
    assert match, f"/metrics has no {name}"
    return float(match.group(1))


def wait_for(condition, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def log_faults(log_path: Path) -> dict[str, int]:
    text = log_path.read_text()
    return {fault: text.count(fault) for fault in LOG_FAULTS if fault in text}


def test_sigterm_past_the_shutdown_timeout_answers_503_and_errors_never_500(long_context_model, tmp_path):
    log_path = tmp_path / "serve.log"
    plain: list[Any] = [None] * 3  # (status, content type, body) of each non-streamed request
    streams: list[Any] = [None] * 3  # (status, [data events]) of each stream
    first_chunks = threading.Semaphore(0)

    def non_streaming(i: int) -> None:
        try:
            body = {**LONG, "prompt": f"x{i}", **(TWO_SAMPLES if i == 0 else {})}
            r = httpx.post(url + "/v1/completions", json=body, timeout=120)
            plain[i] = (r.status_code, r.headers.get("content-type", ""), r.text)
        except httpx.HTTPError as exc:
            plain[i] = (None, "", repr(exc))

    def streaming(i: int) -> None:
        events: list[str] = []
        path, body = (("/v1/chat/completions", {"model": "tiny", "messages": [{"role": "user", "content": "hi"}],
                                                "max_tokens": CONTEXT - 64, "ignore_eos": True})
                      if i == 0 else ("/v1/completions", {**LONG, "prompt": f"y{i}", **(TWO_SAMPLES if i == 2 else {})}))
        try:
            with httpx.stream("POST", url + path, json={**body, "stream": True}, timeout=120) as r:
                streams[i] = (r.status_code, events)
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        events.append(line[len("data: "):])
                        if len(events) == 2:
                            first_chunks.release()
        except httpx.HTTPError as exc:
            streams[i] = (streams[i] or (None, events))[0], events + [f"<cut: {exc!r}>"]
        finally:
            if len(events) < 2:
                first_chunks.release()

    with serve(long_context_model, log_path, shutdown_timeout=1.0) as (proc, url):
        clients = [threading.Thread(target=non_streaming, args=(i,)) for i in range(3)]
        clients += [threading.Thread(target=streaming, args=(i,)) for i in range(3)]
        for t in clients:
            t.start()
        for _ in range(3):
            assert first_chunks.acquire(timeout=60), "a stream did not start"
        wait_for(lambda: gauge(url, "hyspec_num_requests_running") == 8, "all eight engine requests to run")
        proc.send_signal(signal.SIGTERM)

        def draining() -> bool:
            try:
                return httpx.get(url + "/health", timeout=5).status_code == 503
            except httpx.ConnectError:
                return True  # (today's main: the listener is already closed)

        wait_for(draining, "/health to say the server is draining", timeout=10)
        try:
            late = httpx.post(url + "/v1/completions", json={**LONG, "max_tokens": 4}, timeout=30)
            after_signal = (late.status_code, late.headers.get("retry-after"), late.headers.get("content-type", ""),
                            late.text)
        except httpx.ConnectError as exc:
            after_signal = (None, None, "", repr(exc))
        for t in clients:
            t.join(120)
        returncode = proc.wait(timeout=60)
    faults = log_faults(log_path)
    print(f"\nnon-streamed: {[p[:2] for p in plain]}\nstreams: {[(s[0], s[1][-2:]) for s in streams]}\n"
          f"after the signal: {after_signal[:3]}\nlog faults: {faults}\nexit status: {returncode}")

    assert after_signal[0] == 503, f"a request after SIGTERM got {after_signal}"
    assert after_signal[1] is not None and int(after_signal[1]) >= 1
    assert json.loads(after_signal[3])["error"]["code"] == 503
    for status, content_type, body in plain:
        assert status in (200, 503) and content_type == "application/json", (status, content_type, body[:300])
        if status == 503:
            assert "shut down" in json.loads(body)["error"]["message"]
    for status, events in streams:
        assert status == 200 and events[-1] == "[DONE]", events[-3:]
        last = json.loads(events[-2])  # an error event, or the last chunk of a request that finished in time
        if "error" in last:
            assert last["error"]["code"] == 503 and "shut down" in last["error"]["message"], last
        else:
            assert last["choices"][-1]["finish_reason"] is not None, last
    assert not faults, f"the server log has {faults}:\n{log_path.read_text()[-4000:]}"
    assert returncode == 0, log_path.read_text()[-3000:]


def test_a_non_streaming_client_that_hangs_up_leaves_no_traceback(long_context_model, tmp_path):
    log_path = tmp_path / "serve.log"
    with serve(long_context_model, log_path, shutdown_timeout=5.0) as (proc, url):
        body = json.dumps(LONG).encode()
        port = int(url.rsplit(":", 1)[1])
        request = (f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                   f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body
        for _ in range(2):
            with socket.create_connection(("127.0.0.1", port)) as sock:
                sock.sendall(request)
                wait_for(lambda: gauge(url, "hyspec_num_requests_running") == 1, "the request to run")
            # gone before the (non-streamed) answer is ready: the server aborts the request
            wait_for(lambda: gauge(url, "hyspec_num_requests_in_flight") == 0
                     and gauge(url, "hyspec_num_requests_running") == 0, "the request to be aborted")
        with httpx.stream("POST", url + "/v1/completions", json={**LONG, **TWO_SAMPLES, "stream": True},
                          timeout=60) as r:
            events = (line for line in r.iter_lines() if line.startswith("data: "))
            next(events), next(events)  # then the streaming client hangs up too
        wait_for(lambda: gauge(url, "hyspec_num_requests_in_flight") == 0, "the stream to be aborted")
        proc.send_signal(signal.SIGTERM)
        returncode = proc.wait(timeout=60)
    faults = log_faults(log_path)
    print(f"\nlog faults: {faults}\nexit status: {returncode}")
    assert not faults, f"the server log has {faults}:\n{log_path.read_text()[-4000:]}"
    assert returncode == 0


def test_a_second_sigint_cuts_the_drain_short_and_the_process_still_exits(long_context_model, tmp_path):
    """The operator's second Ctrl+C: no more waiting for in-flight work, but a clean exit (uvicorn skips its
    lifespan shutdown then, and the engine loop holding the main thread must still be stopped)."""
    log_path = tmp_path / "serve.log"
    answer: list[httpx.Response] = []
    with serve(long_context_model, log_path, shutdown_timeout=300.0) as (proc, url):
        client = threading.Thread(target=lambda: answer.append(
            httpx.post(url + "/v1/completions", json=LONG, timeout=120)))
        client.start()
        wait_for(lambda: gauge(url, "hyspec_num_requests_running") == 1, "the request to run")
        proc.send_signal(signal.SIGINT)
        wait_for(lambda: httpx.get(url + "/health", timeout=5).status_code == 503, "the server to drain")
        proc.send_signal(signal.SIGINT)
        returncode = proc.wait(timeout=60)  # far less than the 300 s drain the first signal started
        client.join(60)
    assert answer[0].status_code == 503 and "shut down" in answer[0].json()["error"]["message"]
    assert not log_faults(log_path), log_path.read_text()[-3000:]
    assert returncode == 0


@pytest.mark.parametrize("value", ["-1", "nan", "inf"])
def test_a_shutdown_timeout_that_is_not_a_duration_is_refused_before_the_model_loads(value, capsys):
    from hyspec.cli import serve as serve_cli

    parser = argparse.ArgumentParser()
    serve_cli.add_arguments(parser)
    with pytest.raises(SystemExit):
        parser.parse_args(["--shutdown-timeout", value])
    assert "--shutdown-timeout: must be a number of seconds >= 0" in capsys.readouterr().err
