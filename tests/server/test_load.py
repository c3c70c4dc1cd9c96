"""Concurrent streaming clients on loopback (scripts/load_test.py): every stream complete, each output equal
to the same request run alone at temperature 0 (no token lost, duplicated or mixed up), KV pool empty after."""
from __future__ import annotations

import asyncio
import importlib.util
import sys
from pathlib import Path

import pytest

from tests.server.conftest import kv_pool_empty

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "load_test.py"


def load_script():
    spec = importlib.util.spec_from_file_location("hyspec_load_test", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def run_load(make_server, clients: int, duration: float, max_tokens: int):
    load = load_script()
    srv = make_server(max_queue=clients, engine_overrides={"max_num_seqs": clients, "kv_cache_bytes": 16 << 20})
    try:
        report = load.run_load(srv.url, clients=clients, duration=duration, max_tokens=max_tokens)
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
