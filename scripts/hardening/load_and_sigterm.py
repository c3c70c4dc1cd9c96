"""The load and SIGTERM parts of the hardening run (scripts/hardening/run.py): 32 streaming clients, a third
leaving mid-stream; SIGTERM with requests in flight and new ones arriving during the drain."""
from __future__ import annotations

import asyncio
import json
import re
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
from hostile_cases import CH, C, chat, comp, short
from serve_process import Server

# -- 32 streaming clients with disconnects -------------------------------------------------------------


async def stream_client(url: str, headers: dict, i: int, leave_after: int | None, max_tokens: int) -> dict[str, Any]:
    chat_api = i % 2 == 0
    body = (chat(messages=[{"role": "user", "content": f"Client {i}: write a long story about the sea."}],
                 max_tokens=max_tokens, stream=True, ignore_eos=True, temperature=0.0) if chat_api else
            comp(prompt=f"Client {i}: once upon a time", max_tokens=max_tokens, stream=True, ignore_eos=True,
                 temperature=0.0))
    row: dict[str, Any] = {"client": i, "api": "chat" if chat_api else "completions",
                           "leaves_after_chunks": leave_after,
                           "chunks": 0, "done": False, "error_event": False}
    t0 = time.monotonic()
    try:
        async with httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(120.0)) as client, \
                client.stream("POST", CH if chat_api else C, json=body, headers=headers) as r:
            row["status"] = r.status_code
            async for line in r.aiter_lines():
                if line == "data: [DONE]":
                    row["done"] = True
                elif line.startswith("data: "):
                    row["chunks"] += 1
                    row["error_event"] |= '"error"' in line[:20]
                if leave_after is not None and row["chunks"] >= leave_after:
                    break  # closing the response closes the connection mid-stream
    except httpx.HTTPError as exc:
        row["exception"] = f"{type(exc).__name__}: {exc}"
    row["seconds"] = round(time.monotonic() - t0, 2)
    return row


async def impatient_client(url: str, headers: dict, i: int) -> dict[str, Any]:
    """A non-streamed request whose client gives up after 1.5 s (the connection is closed)."""
    row: dict[str, Any] = {"client": f"impatient-{i}", "status": None}
    try:
        async with httpx.AsyncClient(base_url=url, timeout=1.5) as client:
            r = await client.post(C, json=comp(prompt=f"Impatient {i}", max_tokens=400, ignore_eos=True),
                                  headers=headers)
            row["status"] = r.status_code
    except httpx.TimeoutException:
        row["left"] = True
    except httpx.HTTPError as exc:
        row["exception"] = f"{type(exc).__name__}: {exc}"
    return row


def load_run(out: Path, suffix: str, clients: int = 32, max_tokens: int = 16) -> dict[str, Any]:
    # 512 MiB of KV (the default is 2 GiB; 46 KiB a token) holds 11.6k tokens, little more than one 8,192-token
    # context; the impatient clients' 400-token requests and the streams share it.
    server = Server(out / f"logs{suffix}" / "load.log", extra=("--kv-cache-bytes", "512MiB", "--max-num-seqs", "32"))
    result: dict[str, Any] = {"server": "hyspec serve --kv-cache-bytes 512MiB --max-num-seqs 32",
                              "clients": clients, "max_tokens": max_tokens}
    try:
        result["startup_s"] = round(server.wait_ready(), 1)
        httpx.post(server.url + C, json=comp(max_tokens=8), timeout=120)  # warm-up
        result["rss_mib_before"] = server.rss_mib()
        result["metrics_before"] = server.metrics()

        async def everyone() -> list[dict[str, Any]]:
            streams = [stream_client(server.url, {}, i, 3 if i % 3 == 0 else None, max_tokens) for i in range(clients)]
            impatient = [impatient_client(server.url, {}, i) for i in range(4)]
            return await asyncio.wait_for(asyncio.gather(*streams, *impatient), timeout=400)

        t0 = time.monotonic()
        rows = asyncio.run(everyone())
        result["seconds"] = round(time.monotonic() - t0, 1)
        result["rows"] = rows
        streams = [r for r in rows if isinstance(r["client"], int)]
        result["statuses"] = sorted({str(r.get("status")) for r in rows})
        result["5xx"] = sum(1 for r in rows if (r.get("status") or 0) >= 500)
        result["streams_completed"] = sum(1 for r in streams if r["leaves_after_chunks"] is None and r["done"]
                                          and not r["error_event"])
        result["streams_meant_to_complete"] = sum(1 for r in streams if r["leaves_after_chunks"] is None)
        result["streams_left"] = sum(1 for r in streams if r["leaves_after_chunks"] is not None)
        result["error_events"] = sum(1 for r in streams if r["error_event"])
        result["after"] = server.wait_idle(120)
        result["rss_mib_after"] = server.rss_mib()
    finally:
        result["exit_status"] = server.stop()
        result.update(server.finish_log())
    return result


# -- SIGTERM under load --------------------------------------------------------------------------------


async def long_request(url: str, i: int, max_tokens: int) -> dict[str, Any]:
    streaming = i % 2 == 0
    body = comp(prompt=f"Request {i}: tell me everything", max_tokens=max_tokens, ignore_eos=True, stream=streaming,
                temperature=0.0)
    row: dict[str, Any] = {"request": i, "stream": streaming, "status": None, "content_type": None}
    t0 = time.monotonic()
    try:
        async with httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(120.0)) as client:
            if streaming:
                row.update(chunks=0, done=False, error_event=None, finish_reason=None)
                async with client.stream("POST", C, json=body) as r:
                    row["status"], row["content_type"] = r.status_code, r.headers.get("content-type")
                    async for line in r.aiter_lines():
                        if line == "data: [DONE]":
                            row["done"] = True
                        elif line.startswith("data: "):
                            event = json.loads(line[6:])
                            if "error" in event:
                                row["error_event"] = short(event["error"].get("message"), 120)
                            else:
                                row["chunks"] += 1
                                row["finish_reason"] = event["choices"][0].get("finish_reason") or row["finish_reason"]
            else:
                r = await client.post(C, json=body)
                row["status"], row["content_type"] = r.status_code, r.headers.get("content-type")
                try:
                    payload = r.json()
                    row["body"] = (short(payload["error"]["message"], 120) if "error" in payload
                                   else f"{payload['usage']['completion_tokens']} tokens, finish "
                                        f"{payload['choices'][0]['finish_reason']}")
                except ValueError:
                    row["body"] = "not JSON: " + short(r.text, 120)
    except httpx.HTTPError as exc:
        row["exception"] = f"{type(exc).__name__}: {exc}"
    row["ended_s_after_start"] = round(time.monotonic() - t0, 2)
    return row


async def late_request(url: str, signalled: float, delay: float, path: str) -> dict[str, Any]:
    """A request on a new connection ``delay`` seconds after SIGTERM."""
    await asyncio.sleep(max(0.0, signalled + delay - time.monotonic()))
    row: dict[str, Any] = {"sent_s_after_signal": round(time.monotonic() - signalled, 2), "path": path, "status": None}
    try:
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            r = await (client.get(path) if path == "/health" else client.post(path, json=comp()))
            row.update(status=r.status_code, retry_after=r.headers.get("retry-after"),
                       content_type=r.headers.get("content-type"), body=short(r.text, 120))
    except httpx.HTTPError as exc:
        row["exception"] = type(exc).__name__
    row["answered_s_after_signal"] = round(time.monotonic() - signalled, 2)
    return row


async def watch_health(url: str, signalled: float, limit_s: float = 30.0) -> dict[str, Any]:
    """GET /health every 0.25 s after SIGTERM: when it first stopped saying 200, and when connections were refused."""
    seen: dict[str, Any] = {"first_not_200_s": None, "first_not_200": None, "refused_from_s": None, "probes": 0}
    async with httpx.AsyncClient(base_url=url, timeout=5) as client:
        while time.monotonic() - signalled < limit_s:
            at = round(time.monotonic() - signalled, 2)
            seen["probes"] += 1
            try:
                r = await client.get("/health")
                if r.status_code != 200 and seen["first_not_200_s"] is None:
                    seen["first_not_200_s"], seen["first_not_200"] = at, f"{r.status_code} {short(r.text, 80)}"
            except httpx.ConnectError:
                seen["refused_from_s"] = at
                break
            except httpx.HTTPError:
                pass
            await asyncio.sleep(0.25)
    return seen


def sigterm_run(out: Path, suffix: str, name: str, max_tokens: int, shutdown_timeout: float = 3.0) -> dict[str, Any]:
    server = Server(out / f"logs{suffix}" / f"sigterm-{name}.log",
                    extra=("--shutdown-timeout", str(shutdown_timeout)))
    result: dict[str, Any] = {"run": name, "server": f"hyspec serve --shutdown-timeout {shutdown_timeout}",
                              "requests": 8, "max_tokens": max_tokens}
    rows: list[dict[str, Any]] = []
    late_rows: list[dict[str, Any]] = []
    try:
        result["startup_s"] = round(server.wait_ready(), 1)
        httpx.post(server.url + C, json=comp(max_tokens=4), timeout=120)  # warm-up
        result["rss_mib_before"] = server.rss_mib()

        async def scenario() -> tuple[list, list, float]:
            work = [asyncio.ensure_future(long_request(server.url, i, max_tokens)) for i in range(8)]
            deadline = time.monotonic() + 60  # until all 8 are in the engine
            async with httpx.AsyncClient(base_url=server.url, timeout=5) as client:
                while time.monotonic() < deadline:
                    text = (await client.get("/metrics")).text
                    m = re.search(r"^hyspec_num_requests_in_flight\{[^}]*\} (\S+)", text, re.MULTILINE)
                    if m and float(m.group(1)) >= 8:
                        break
                    await asyncio.sleep(0.1)
            signalled = time.monotonic()
            server.proc.send_signal(signal.SIGTERM)
            watcher = asyncio.ensure_future(watch_health(server.url, signalled))
            late = [late_request(server.url, signalled, d, p) for d in (0.2, 1.0, 2.5) for p in (C, "/health")]
            late_rows = await asyncio.gather(*late)
            rows = await asyncio.wait_for(asyncio.gather(*work), timeout=shutdown_timeout + 120)
            return rows, late_rows, signalled, await watcher

        rows, late_rows, signalled, result["health_after_signal"] = asyncio.run(scenario())
        result["in_flight"] = rows
        result["during_drain"] = late_rows
        try:
            result["exit_status"] = server.proc.wait(shutdown_timeout + 90)
            result["exit_s_after_signal"] = round(time.monotonic() - signalled, 1)
        except subprocess.TimeoutExpired:
            result["exit_status"] = "still running"
    finally:
        status = server.stop()
        result.setdefault("exit_status", status)
        if result["exit_status"] == "still running":
            result["exit_status_after_kill"] = status
        result.update(server.finish_log())
    result["5xx"] = sum(1 for r in rows + late_rows if (r.get("status") or 0) >= 500 and r["status"] != 503)
    result["late_503_with_retry_after"] = sum(1 for r in late_rows if r.get("status") == 503 and r.get("retry_after"))
    result["late_refused"] = sum(1 for r in late_rows if r.get("exception") == "ConnectError")
    result["in_flight_statuses"] = [r.get("status") for r in rows]
    result["streams_done"] = sum(1 for r in rows if r["stream"] and r.get("done"))
    result["streams_error_event"] = sum(1 for r in rows if r["stream"] and r.get("error_event"))
    result["requests_finished"] = sum(1 for r in rows if r.get("finish_reason") == "length"
                                      or "finish length" in str(r.get("body")))
    return result

