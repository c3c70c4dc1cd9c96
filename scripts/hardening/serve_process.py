"""`hyspec serve` as a subprocess of the hardening run (scripts/hardening/run.py): start, probe, stop, and its
log cut to head and tail."""
from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[2]
#: where the results go by default, and what the logs' paths in them are relative to
RESULTS = REPO / "docs" / "results" / "2026-12-06" / "hardening"
START_TIMEOUT_S = 240.0
LOG_KEEP_BYTES = 6_000  # of each server log: this much of its head and of its tail


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def hyspec_command() -> list[str]:
    script = Path(sys.executable).parent / "hyspec"
    return [str(script)] if script.exists() else [sys.executable, "-m", "hyspec.cli.main"]


class Server:
    """`hyspec serve` in a subprocess, its output in ``log_path``."""

    def __init__(self, log_path: Path, api_key: str | None = None, extra: tuple[str, ...] = ()):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.api_key = api_key
        self.log_path = log_path
        self.argv = [*hyspec_command(), "serve", "--port", str(self.port), *extra]
        env = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}
        env.pop("HYSPEC_API_KEY", None)
        if api_key:
            env["HYSPEC_API_KEY"] = api_key  # not on the command line, where `ps` would show it
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(log_path, "wb")  # noqa: SIM115 - the server writes to it until stop() closes it
        self.started_at = time.monotonic()
        self.proc = subprocess.Popen(self.argv, stdout=self._log, stderr=subprocess.STDOUT, env=env, cwd=REPO)
        self.exit_status: int | None = None

    @property
    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def wait_ready(self) -> float:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"hyspec serve exited with {self.proc.returncode}; see {self.log_path}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return time.monotonic() - self.started_at
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"hyspec serve did not answer /health within {START_TIMEOUT_S:.0f} s")

    def rss_mib(self) -> float | None:
        try:
            text = Path(f"/proc/{self.proc.pid}/status").read_text()
        except OSError:
            return None
        m = re.search(r"^VmRSS:\s+(\d+) kB", text, re.MULTILINE)
        return round(int(m.group(1)) / 1024, 1) if m else None

    def metrics(self) -> dict[str, float]:
        text = httpx.get(self.url + "/metrics", headers=self.auth, timeout=10).text
        wanted = ("hyspec_kv_cache_free_pages", "hyspec_kv_cache_total_pages", "hyspec_kv_cache_usage_perc",
                  "hyspec_num_requests_running", "hyspec_num_requests_waiting", "hyspec_num_requests_in_flight",
                  "hyspec_engine_step_failures_total")
        out = {}
        for line in text.splitlines():
            name = line.split("{", 1)[0].split(" ", 1)[0]
            if name in wanted:
                out[name] = float(line.rsplit(" ", 1)[1])
        return out

    def wait_idle(self, timeout: float = 60.0) -> dict[str, Any]:
        """/metrics once nothing is in flight (or at ``timeout``), with how long that took."""
        t0 = time.monotonic()
        m: dict[str, float] = {}
        while time.monotonic() - t0 < timeout:
            try:
                m = self.metrics()
            except httpx.HTTPError:
                m = {}
            if m.get("hyspec_num_requests_in_flight", 1) == 0 and m.get("hyspec_num_requests_running", 1) == 0:
                break
            time.sleep(0.5)
        time.sleep(1.5)  # the engine publishes its stats once a second when idle
        try:
            m = self.metrics()
        except httpx.HTTPError:
            pass
        return {**m, "kv_pool_empty": m.get("hyspec_kv_cache_free_pages") == m.get("hyspec_kv_cache_total_pages")
                and m.get("hyspec_kv_cache_total_pages") is not None,
                "seconds_to_idle": round(time.monotonic() - t0, 1)}

    def stop(self, timeout: float = 90.0) -> int:
        """SIGTERM, wait; SIGKILL past ``timeout`` (reported as exit status -9)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.exit_status = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.exit_status = self.proc.wait(30)
        self._log.close()
        return self.exit_status

    def finish_log(self) -> dict[str, Any]:
        """Count tracebacks and error lines, then cut the log to its head and tail."""
        data = self.log_path.read_bytes()
        text = data.decode("utf-8", "replace")
        first = text.find("Traceback")
        summary = {"log": os.path.relpath(self.log_path, RESULTS), "log_bytes": len(data),
                   "traceback_lines": text.count("Traceback (most recent call last)"),
                   "error_lines": sum(1 for line in text.splitlines() if " ERROR" in line or line.startswith("ERROR")),
                   "first_traceback": text[first:first + 2500] if first >= 0 else None}
        if len(data) > 2 * LOG_KEEP_BYTES:
            cut = f"\n[... {len(data) - 2 * LOG_KEEP_BYTES} bytes cut by run.py ...]\n".encode()
            self.log_path.write_bytes(data[:LOG_KEEP_BYTES] + cut + data[-LOG_KEEP_BYTES:])
        return summary
