"""A ``hyspec serve`` child process on a free loopback port, and the wait for its ``/health``.

What everything that starts a real server process shares: ``hyspec bench-server``, ``hyspec soak`` and
the tests that run ``hyspec serve`` as a process (tests/server/test_cli_serve.py,
test_hardening_shutdown.py).  httpx comes with the serve and dev extras; this module is imported only by
those tools.
"""
from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Callable

import httpx


class ServerExited(RuntimeError):
    """The server process ended before its /health answered."""


def free_port() -> int:
    """A loopback port nothing listens on now (the short race with other processes is acceptable here)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until_healthy(url: str, process: subprocess.Popen, timeout_s: float,
                       log_tail: Callable[[], str] = str, interval_s: float = 0.2) -> None:
    """Return once ``GET url/health`` answers 200.

    Raises ServerExited when ``process`` ends first and TimeoutError after ``timeout_s``; both messages end
    with ``log_tail()`` (the server's last log lines, however the caller keeps them).
    """
    deadline = time.monotonic() + timeout_s
    while True:
        if process.poll() is not None:
            raise ServerExited(f"the server exited with status {process.returncode} during start-up:\n{log_tail()}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass  # not listening yet
        if time.monotonic() > deadline:
            raise TimeoutError(f"the server at {url} was not ready within {timeout_s:g} s:\n{log_tail()}")
        time.sleep(interval_s)
