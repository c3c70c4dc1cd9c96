"""A real server on 127.0.0.1 around the tiny checkpoint (random weights, real tokenizer with a chat template)."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

import pytest

from tests.model.tiny_checkpoint import make_checkpoint

MODEL_NAME = "tiny"
MAX_MODEL_LEN = 96
ENGINE_ARGS = {"dtype": "float32", "backend": "cpu", "kv_cache_bytes": 4 << 20, "max_model_len": MAX_MODEL_LEN,
               "max_num_seqs": 16}


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("server_tiny")
    make_checkpoint(path)
    return path


@pytest.fixture(scope="session")
def make_server(tiny_model_dir) -> Callable[..., Any]:
    """``make_server(**create_app kwargs, engine_overrides={...})`` -> a started BackgroundServer (stop it)."""
    from hyspec.server.app import create_app
    from hyspec.server.launcher import BackgroundServer

    def make(engine_overrides: dict | None = None, **app_kwargs: Any) -> BackgroundServer:
        args = {"model": str(tiny_model_dir), **ENGINE_ARGS, **(engine_overrides or {})}
        app_kwargs.setdefault("served_model_name", MODEL_NAME)
        return BackgroundServer(create_app(args, **app_kwargs)).start()

    return make


@pytest.fixture(scope="module")
def server(make_server):
    srv = make_server(max_queue=8)
    yield srv
    srv.stop()


def engine_of(server) -> Any:
    return server.app.state.async_engine.engine


def wait_until(condition: Callable[[], bool], timeout: float = 20.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.01)


def kv_pool_empty(server) -> bool:
    pool = engine_of(server).pool
    return pool.num_free == pool.num_pages
