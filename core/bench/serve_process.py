"""A server child process on a free loopback port, and the wait for its ``/health``.

What everything that starts a real server process shares: ``hyspec bench-server`` and ``hyspec soak``
(``hyspec serve`` children), hyspec.bench.vllm_server (a vLLM server from another venv) and the tests
that run ``hyspec serve`` as a process (tests/server/test_cli_serve.py, test_hardening_shutdown.py).
Standard library only, so a caller needs no HTTP client to start a server.
"""
from __future__ import annotations

import socket
import subprocess
import time
import urllib.error
import urllib.request
from typing import Callable


class ServerExited(RuntimeError):
    """The server process ended before its /health answered."""


def free_port() -> int:
    """A loopback port nothing listens on now (the short race with other processes is acceptable here)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def healthy(url: str, timeout_s: float = 2.0) -> bool:
    """Whether ``GET url/health`` answers 200 (a refused connection, a 503 while starting or draining: no)."""
    try:
        with urllib.request.urlopen(url + "/health", timeout=timeout_s) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


def wait_until_healthy(url: str, process: subprocess.Popen, timeout_s: float, log_tail: Callable[[], str] = str,
                       interval_s: float = 0.2, name: str = "the server") -> None:
    """Return once ``url``'s /health answers 200.

    Raises ServerExited when ``process`` ends first and TimeoutError after ``timeout_s``; both messages end
    with ``log_tail()`` (the server's last log lines or where its log is, however the caller keeps it).
    """
    deadline = time.monotonic() + timeout_s
    while True:
        if process.poll() is not None:
            raise ServerExited(f"{name} exited with status {process.returncode} during start-up{log_tail()}")
        if healthy(url):
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"{name} did not answer /health within {timeout_s:.0f} s{log_tail()}")
        time.sleep(interval_s)
