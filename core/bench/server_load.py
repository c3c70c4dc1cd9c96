"""Load test of a hyspec server: N concurrent streaming clients on loopback for a bounded time.

Each client streams /v1/completions (temperature 0, ignore_eos, token ids
returned) one request after another until the time is up.  Then each distinct
request is run again alone, and the test checks that every stream

  * was well-formed SSE, ended with ``data: [DONE]`` and had a finish reason,
  * carried exactly max_tokens token ids, as many as its usage says,
  * equals the same request run alone, token for token and in text
    (nothing lost, duplicated or mixed up between concurrent requests),

and that afterwards nothing is in flight and the KV pool is back to empty
(read from /metrics).  ``hyspec load-test`` runs it (hyspec.cli.load_test); ``hyspec soak`` drives
its long run through :func:`run_load`.
"""
from __future__ import annotations

import asyncio
import json
import re
import statistics
import time
from dataclasses import asdict, dataclass, field

import httpx


@dataclass
class StreamResult:
    prompt: str | list[int]  # text, or token ids
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    usage_completion_tokens: int | None = None
    saw_done: bool = False
    error: str | None = None
    ttft: float | None = None  # request sent -> first token id
    tpot: float | None = None  # first -> last token id, per token after the first
    latency: float = 0.0


@dataclass
class LoadReport:
    clients: int
    duration_s: float
    max_tokens: int
    requests: int = 0
    tokens: int = 0
    wall_s: float = 0.0
    tokens_per_s: float = 0.0
    ttft_p50_s: float | None = None
    ttft_p99_s: float | None = None
    latency_p50_s: float | None = None
    latency_p99_s: float | None = None
    problems: list[str] = field(default_factory=list)
    kv_usage_after: float | None = None
    in_flight_after: float | None = None

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict:
        return {**asdict(self), "ok": self.ok}


def make_prompts(count: int) -> list[str]:
    """Distinct prompts of varied length (so prefill chunks and decodes mix in the batches)."""
    return [f"def f{i}(x):\n" + "    x = x + 1\n" * (i % 5) + f"    return x * {i}" for i in range(count)]


async def stream_once(client: httpx.AsyncClient, model: str | None, prompt: str | list[int],
                      max_tokens: int) -> StreamResult:
    """One greedy streamed completion; what went wrong is in ``error`` (the stream is read no further)."""
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}, "return_token_ids": True}
    if model:
        body["model"] = model
    result, t0 = StreamResult(prompt), time.perf_counter()
    last_token_at = None
    try:
        async with client.stream("POST", "/v1/completions", json=body) as r:
            if r.status_code != 200:
                result.error = f"HTTP {r.status_code}: {(await r.aread())[:200]!r}"
                return result
            async for line in r.aiter_lines():
                if not line:
                    continue
                if not line.startswith("data: "):
                    result.error = f"not an SSE data line: {line[:80]!r}"
                    return result
                payload = line[len("data: "):]
                if payload == "[DONE]":
                    result.saw_done = True
                    continue
                if result.saw_done:
                    result.error = "data after [DONE]"
                    return result
                chunk = json.loads(payload)
                if "error" in chunk:
                    result.error = f"error event: {chunk['error']}"
                    continue
                if chunk.get("usage"):
                    result.usage_completion_tokens = chunk["usage"]["completion_tokens"]
                for choice in chunk["choices"]:
                    if choice.get("token_ids"):
                        last_token_at = time.perf_counter()
                        if result.ttft is None:
                            result.ttft = last_token_at - t0
                    result.text += choice["text"]
                    result.token_ids += choice.get("token_ids") or []
                    result.finish_reason = choice.get("finish_reason") or result.finish_reason
    except (httpx.HTTPError, json.JSONDecodeError, KeyError) as exc:
        result.error = f"{type(exc).__name__}: {exc}"
    result.latency = time.perf_counter() - t0
    if last_token_at is not None and len(result.token_ids) > 1:
        result.tpot = (last_token_at - t0 - result.ttft) / (len(result.token_ids) - 1)
    return result


async def alone(client: httpx.AsyncClient, model: str | None, prompt: str, max_tokens: int) -> tuple[str, list[int]]:
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
            "return_token_ids": True}
    if model:
        body["model"] = model
    r = await client.post("/v1/completions", json=body)
    r.raise_for_status()
    choice = r.json()["choices"][0]
    return choice["text"], choice["token_ids"]


async def scrape(client: httpx.AsyncClient, name: str) -> float | None:
    text = (await client.get("/metrics")).text
    m = re.search(rf"^{re.escape(name)}\{{[^}}]*\}} (\S+)$", text, re.MULTILINE)
    return float(m.group(1)) if m else None


async def run_load(base_url: str, clients: int = 64, duration: float = 10.0, max_tokens: int = 16,
                   model: str | None = None, api_key: str | None = None, num_prompts: int | None = None,
                   grace: float = 120.0) -> LoadReport:
    """Drive the server at ``base_url``; see the module docstring for what is checked."""
    report = LoadReport(clients, duration, max_tokens)
    prompts = make_prompts(num_prompts or 2 * clients)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    # Idle connections expire on the client before the server's 5 s keep-alive closes them; equal
    # timeouts race, and a request sent on a connection the server is closing fails with ReadError.
    limits = httpx.Limits(max_connections=clients + 4, max_keepalive_connections=clients + 4, keepalive_expiry=2.0)
    async with httpx.AsyncClient(base_url=base_url, headers=headers, limits=limits,
                                 timeout=httpx.Timeout(duration + grace)) as client:
        results: list[StreamResult] = []
        deadline = time.perf_counter() + duration

        async def client_loop(c: int) -> None:
            k = 0
            while time.perf_counter() < deadline:
                results.append(await stream_once(client, model, prompts[(c + k * clients) % len(prompts)],
                                                 max_tokens))
                k += 1

        t0 = time.perf_counter()
        await asyncio.wait_for(asyncio.gather(*(client_loop(c) for c in range(clients))), duration + grace)
        report.wall_s = time.perf_counter() - t0

        used = sorted({r.prompt for r in results})
        references = {p: await alone(client, model, p, max_tokens) for p in used}
        for r in results:
            problem = _check(r, references[r.prompt], max_tokens)
            if problem:
                report.problems.append(f"{r.prompt[:24]!r}: {problem}")
        for _ in range(50):  # stats are published after each engine step; give the last one a moment
            report.kv_usage_after = await scrape(client, "hyspec_kv_cache_usage_perc")
            report.in_flight_after = await scrape(client, "hyspec_num_requests_in_flight")
            if report.kv_usage_after == 0 and report.in_flight_after == 0:
                break
            await asyncio.sleep(0.1)
    if report.kv_usage_after != 0:
        report.problems.append(f"KV pool not empty after the load: usage {report.kv_usage_after}")
    if report.in_flight_after != 0:
        report.problems.append(f"requests still in flight after the load: {report.in_flight_after}")
    report.requests = len(results)
    report.tokens = sum(len(r.token_ids) for r in results)
    report.tokens_per_s = report.tokens / report.wall_s if report.wall_s else 0.0
    ttfts = sorted(r.ttft for r in results if r.ttft is not None)
    latencies = sorted(r.latency for r in results)
    report.ttft_p50_s, report.ttft_p99_s = percentile(ttfts, 50), percentile(ttfts, 99)
    report.latency_p50_s, report.latency_p99_s = percentile(latencies, 50), percentile(latencies, 99)
    if report.requests < clients:
        report.problems.append(f"only {report.requests} requests completed for {clients} clients")
    return report


def _check(r: StreamResult, reference: tuple[str, list[int]], max_tokens: int) -> str | None:
    if r.error:
        return r.error
    if not r.saw_done:
        return "the stream did not end with data: [DONE]"
    if r.finish_reason != "length":
        return f"finish_reason {r.finish_reason!r}, expected 'length' (ignore_eos, max_tokens={max_tokens})"
    if len(r.token_ids) != max_tokens or r.usage_completion_tokens != max_tokens:
        return f"{len(r.token_ids)} token ids streamed, usage says {r.usage_completion_tokens}, asked {max_tokens}"
    ref_text, ref_ids = reference
    if r.token_ids != ref_ids:
        first = next(i for i, (a, b) in enumerate(zip(r.token_ids, ref_ids)) if a != b)
        return f"token ids differ from the request run alone from position {first}"
    if r.text != ref_text:
        return f"text differs from the request run alone: {r.text!r} vs {ref_text!r}"
    return None


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1]
