"""Concurrent streaming clients on loopback (hyspec load-test, hyspec.bench.server_load): every stream complete,
each output equal to the same request run alone at temperature 0 (no token lost, duplicated or mixed up), KV pool
empty after."""
from __future__ import annotations

import asyncio

import pytest
from hyspec.bench import server_load

from tests.server.conftest import kv_pool_empty


def run_load(make_server, clients: int, duration: float, max_tokens: int):
    srv = make_server(max_queue=clients, engine_overrides={"max_num_seqs": clients, "kv_cache_bytes": 16 << 20})
    try:
        report = server_load.run_load(srv.url, clients=clients, duration=duration, max_tokens=max_tokens)
        report = asyncio.run(report)
        engine = srv.app.state.async_engine.engine
        assert kv_pool_empty(srv) and not engine.has_unfinished_requests()
        engine.pool.assert_all_free()
    finally:
        srv.stop()
    assert report.ok, report.problems[:5]
    assert report.requests >= clients and report.tokens == report.requests * max_tokens
    return report


def test_eight_concurrent_streams(make_server):
    run_load(make_server, clients=8, duration=1.0, max_tokens=8)


@pytest.mark.slow
def test_sixty_four_concurrent_streams(make_server):
    report = run_load(make_server, clients=64, duration=20.0, max_tokens=16)
    print(f"\n64 clients: {report.requests} requests, {report.tokens_per_s:.0f} tok/s, "
          f"TTFT p50 {report.ttft_p50_s:.3f} s p99 {report.ttft_p99_s:.3f} s")
