"""What one request may take from `hyspec serve` (issue 50, item 1): a chunked body past the size limit is
refused while it arrives (before the API key or the JSON parser read it all), a prompt is bounded in
characters before it is tokenized, tokenizing a long prompt leaves the event loop free (/health answers
meanwhile), and `n` / `best_of` are bounded by a per-request share of the batch.

Each test runs the real server on 127.0.0.1 around the tiny checkpoint (tests/server/conftest.py)."""
from __future__ import annotations

import socket
import threading
import time

import httpx
import pytest

from tests.server.conftest import ENGINE_ARGS, MAX_MODEL_LEN, engine_of

KEY = "s3cret"
AUTH = {"Authorization": f"Bearer {KEY}"}
BODY_LIMIT = 64 << 10


@pytest.fixture(scope="module")
def keyed(make_server):
    srv = make_server(api_key=KEY, max_body_bytes=BODY_LIMIT, max_queue=8)
    yield srv
    srv.stop()


def _post(srv, body: dict, path: str = "/v1/completions") -> httpx.Response:
    return httpx.post(srv.url + path, json=body, headers=AUTH, timeout=60)


def _chunked_upload_status(srv, chunks: int, chunk_bytes: int, authorized: bool) -> int:
    """Send the headers and ``chunks`` chunks of a chunked body, never its last (zero) chunk, then read the status.

    A server that reads the whole body before answering waits for more and the read times out."""
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:{srv.port}\r\nContent-Type: application/json\r\n"
            f"Transfer-Encoding: chunked\r\n{'Authorization: Bearer ' + KEY + chr(13) + chr(10) if authorized else ''}"
            "\r\n").encode()
    with socket.create_connection(("127.0.0.1", srv.port), timeout=20) as sock:
        sock.sendall(head)
        payload = b"x" * chunk_bytes
        for _ in range(chunks):
            sock.sendall(b"%x\r\n%s\r\n" % (len(payload), payload))
        reply = b""
        while b"\r\n" not in reply:
            data = sock.recv(4096)
            assert data, "the server closed the connection without an answer"
            reply += data
    return int(reply.split(b" ", 2)[1])


@pytest.mark.parametrize("authorized, status", [(False, 401), (True, 413)], ids=["no-key", "with-key"])
def test_a_chunked_body_past_the_limit_is_refused_before_it_is_all_sent(keyed, authorized, status):
    # Just past the limit: the refusal must come while the client still has (in principle) megabytes to send;
    # without the key it comes before any of the body is read.
    chunk = 16 << 10
    assert _chunked_upload_status(keyed, BODY_LIMIT // chunk + 1, chunk, authorized) == status
    assert _post(keyed, {"prompt": "x", "max_tokens": 2}).status_code == 200  # still serving


def test_a_chunked_body_under_the_limit_is_served(keyed):
    def body():
        yield b'{"prompt": "x", '
        yield b'"max_tokens": 2}'

    r = httpx.post(keyed.url + "/v1/completions", content=body(), headers={**AUTH, "content-type": "application/json"},
                   timeout=60)
    assert r.status_code == 200, r.text


@pytest.fixture
def encode_calls(keyed, monkeypatch):
    """The lengths of the texts the server's tokenizer was asked to encode."""
    tokenizer = engine_of(keyed).tokenizer
    calls: list[int] = []
    real = tokenizer.encode

    def spy(text, *args, **kwargs):
        calls.append(len(text))
        return real(text, *args, **kwargs)

    monkeypatch.setattr(tokenizer, "encode", spy)
    return calls


@pytest.mark.parametrize("path, body, param", [
    ("/v1/completions", {"prompt": "ab" * 20_000}, "prompt"),
    ("/v1/completions", {"prompt": ["x", "ab" * 20_000]}, "prompt"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "ab" * 20_000}]}, "messages"),
], ids=["prompt", "prompt-list", "chat"])
def test_a_prompt_over_the_character_bound_is_refused_before_it_is_tokenized(keyed, encode_calls, path, body, param):
    bound = 64 * MAX_MODEL_LEN  # the default: a generous 64 characters per token of context
    r = _post(keyed, body, path)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and f"at most {bound} characters" in error["message"], error
    assert "--max-prompt-chars" in error["message"]
    assert all(n <= bound for n in encode_calls), encode_calls


def test_health_answers_while_a_long_prompt_is_tokenized(make_server):
    """The tokenizer's work must not hold the interpreter: /health (and everything else) answers meanwhile."""
    srv = make_server(max_prompt_chars=4_000_000)
    tokenizer = engine_of(srv).tokenizer
    real, spans = tokenizer.encode, []

    def timed(text, *args, **kwargs):
        start = time.monotonic()
        try:
            return real(text, *args, **kwargs)
        finally:
            spans.append((start, time.monotonic()))

    tokenizer.encode = timed
    answered: list[float] = []
    try:
        worker = threading.Thread(target=lambda: httpx.post(srv.url + "/v1/completions", timeout=120,
                                                            json={"prompt": "lorem ipsum " * 150_000}))
        worker.start()
        with httpx.Client(timeout=60) as client:
            while worker.is_alive():
                assert client.get(srv.url + "/health").status_code == 200
                answered.append(time.monotonic())
        worker.join()
    finally:
        del tokenizer.encode
        srv.stop()
    (start, end), = spans
    during = [t for t in answered if start < t < end]
    assert len(during) >= 3, f"/health answered {len(during)} times in the {end - start:.2f} s of tokenizing"


@pytest.mark.parametrize("body, param", [
    ({"prompt": "x", "n": 5, "temperature": 1.0}, "n"),
    ({"prompt": "x", "n": 1, "best_of": 5, "temperature": 1.0}, "best_of"),
])
def test_n_and_best_of_are_bounded_by_a_share_of_the_batch(keyed, body, param):
    share = ENGINE_ARGS["max_num_seqs"] // 4  # the default: a quarter of max_num_seqs
    r = _post(keyed, body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and f"at most {share}" in error["message"] and "--max-n" in error["message"], error
    ok = _post(keyed, {**body, param: share, "max_tokens": 2})
    assert ok.status_code == 200, ok.text


def test_the_n_bound_is_configurable(make_server):
    srv = make_server(max_n=2)
    try:
        r = httpx.post(srv.url + "/v1/completions", json={"prompt": "x", "n": 3, "temperature": 1.0}, timeout=60)
        assert r.status_code == 400 and "at most 2" in r.json()["error"]["message"], r.text
    finally:
        srv.stop()


def test_a_chat_template_past_its_output_bound_is_a_400(make_server, tiny_model_dir, tmp_path):
    """A checkpoint whose template builds a 100 MB string on every chat request: refused, not a 500 or a hang."""
    import json
    import shutil

    model = tmp_path / "tiny"
    shutil.copytree(tiny_model_dir, model)
    config = json.loads((model / "tokenizer_config.json").read_text())
    config["chat_template"] = "{{ 'a' * 10**8 }}"
    (model / "tokenizer_config.json").write_text(json.dumps(config))
    srv = make_server(engine_overrides={"model": str(model)})
    try:
        r = httpx.post(srv.url + "/v1/chat/completions", timeout=60,
                       json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1})
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["param"] == "messages" and "characters, the bound on one rendered prompt" in error["message"]
        assert httpx.get(srv.url + "/health", timeout=30).status_code == 200
    finally:
        srv.stop()
