"""Running the app under uvicorn: in the foreground with signals (``hyspec serve``), or in a thread (tests, load).

Graceful shutdown, in order (both launchers):

1. the first SIGINT/SIGTERM (``BackgroundServer.stop``) makes the app refuse new
   requests: 503 with Retry-After, and ``/health`` says "draining".  The
   listener stays open meanwhile, so that a client hears that answer instead
   of "connection refused";
2. in-flight requests get up to ``shutdown_timeout`` seconds to finish (a
   second SIGINT cuts that short); what is left is aborted in the engine, and
   its clients get a 503 error body, or an SSE error event and ``[DONE]``;
3. only then does uvicorn's own shutdown run: it closes the listener, waits
   (up to ``RESPONSE_GRACE_S``) for those last answers to be written, and the
   lifespan shutdown stops the engine and joins its thread (its own drain,
   create_app's ``drain_timeout``, finds nothing left: it matters only when
   the app runs under plain uvicorn).

Under ``run_server`` Python runs the signal handler on the main thread, which
steps the engine: the drain starts once the step in progress returns.

uvicorn alone would do 3 first: close the listener at once and cancel the
requests still running at its timeout, which answers 500 (text/plain), cuts
streams without an error or ``[DONE]`` and logs a traceback for each.
"""
from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import threading
import time
from typing import TYPE_CHECKING, Any, Iterator

import uvicorn

if TYPE_CHECKING:
    from hyspec.server.async_engine import AsyncEngine

#: Seconds uvicorn waits, after the drain, for the answers of aborted requests to be written (they are ready at
#: once; only a client that stopped reading its stream takes longer) before it cancels what is left.
RESPONSE_GRACE_S = 5.0
#: The same after a second SIGINT, which asks not to wait: only long enough for answers that are ready.
FORCED_EXIT_GRACE_S = 1.0


class _DrainingServer(uvicorn.Server):
    """uvicorn.Server that drains the engine, still answering on its listener, before uvicorn's shutdown runs."""

    def __init__(self, config: uvicorn.Config, async_engine: "AsyncEngine", drain_timeout: float):
        super().__init__(config)
        self.async_engine = async_engine
        self.drain_timeout = drain_timeout

    async def main_loop(self) -> None:
        await super().main_loop()  # returns once a signal or stop() has set should_exit
        await self.async_engine.finish_in_flight(self.drain_timeout, give_up=lambda: self.force_exit)
        if self.force_exit:
            # uvicorn will not wait for any answer now, but those of the requests just aborted are ready: give the
            # event loop (which shares the GIL with a stepping engine) a moment to write them.
            deadline = time.monotonic() + FORCED_EXIT_GRACE_S
            while self.server_state.tasks and time.monotonic() < deadline:
                await asyncio.sleep(0.01)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        await super().shutdown(sockets)
        if self.force_exit:
            # uvicorn skips the lifespan shutdown on a forced exit (a second SIGINT), but the engine loop must
            # still be told to stop: under run_server it holds the main thread.  Nothing is in flight any more
            # (main_loop aborted it), so this is quick.
            await self.lifespan.shutdown()

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        with super().capture_signals():
            yield
            # uvicorn re-raises the signal after a graceful stop (the process then dies of it); a stop the
            # operator asked for that drained cleanly is a normal exit for `hyspec serve`.
            getattr(self, "_captured_signals", []).clear()


def _server(app: Any, host: str, port: int, shutdown_timeout: float, log_level: str,
            access_log: bool) -> _DrainingServer:
    if not 0.0 <= shutdown_timeout < float("inf"):
        raise ValueError(f"shutdown_timeout must be a number of seconds >= 0, got {shutdown_timeout}")
    config = uvicorn.Config(app, host=host, port=port, lifespan="on", log_level=log_level, access_log=access_log,
                            timeout_graceful_shutdown=RESPONSE_GRACE_S, timeout_keep_alive=5)
    return _DrainingServer(config, app.state.async_engine, shutdown_timeout)


def run_server(app: Any, host: str = "127.0.0.1", port: int = 8000, shutdown_timeout: float = 30.0,
               log_level: str = "info", access_log: bool = False) -> None:
    """Serve ``app`` until SIGINT/SIGTERM (blocking; call from the main thread).

    The engine steps on this (the main) thread and uvicorn's event loop runs on a helper thread: the
    main thread already owns the OpenMP thread pool the model was loaded with, and a second pool on
    another thread made every parallel kernel slower (async_engine.py's docstring).  The signals
    that uvicorn would catch on its own main thread are caught here and handed to it.
    """
    async_engine = app.state.async_engine
    server = _server(app, host, port, shutdown_timeout, log_level, access_log)
    thread = threading.Thread(target=server.run, name="uvicorn", daemon=True)
    previous = {sig: signal.signal(sig, server.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        async_engine.claim_driver()  # before the server thread can reach the app's start-up
        thread.start()
        async_engine.drive_on_this_thread(keep_waiting=thread.is_alive)
        thread.join()
        if not server.started:  # e.g. the port was taken: uvicorn logged why
            raise SystemExit(f"hyspec serve: the server did not start on {host}:{port}")
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


class BackgroundServer:
    """Serve ``app`` from a daemon thread on ``host`` (a free port unless given).

    >>> with BackgroundServer(app) as server:
    ...     requests.get(server.url + "/health")
    """

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int = 0, shutdown_timeout: float = 10.0,
                 log_level: str = "warning"):
        self.app = app
        self.host = host
        self._socket = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._socket.bind((host, port))  # bound here, so the port is known before uvicorn starts
        self.port = self._socket.getsockname()[1]
        self.server = _server(app, host, self.port, shutdown_timeout, log_level, False)
        self._thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self._socket]},
                                        name=f"uvicorn-{self.port}", daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout: float = 60.0) -> "BackgroundServer":
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self._thread.is_alive():
                raise RuntimeError("the server thread exited during start-up (see its log)")
            if time.monotonic() > deadline:
                raise TimeoutError(f"the server did not start within {timeout} s")
            time.sleep(0.02)
        return self

    def stop(self, timeout: float = 60.0) -> None:
        """Graceful shutdown (as on SIGTERM); returns when the server thread has exited."""
        self.server.should_exit = True
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise TimeoutError(f"the server did not stop within {timeout} s")

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def __enter__(self) -> "BackgroundServer":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
