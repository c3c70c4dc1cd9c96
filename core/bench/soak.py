"""Soak test of ``hyspec serve``: concurrent streaming clients for a long time, a remote draft worker killed
midway, and every request checked.

Starts the real ``hyspec serve`` (a subprocess, the default model unless ``--model``) with remote drafting on
a local Ray instance, runs ``--clients`` closed-loop streaming clients for ``--duration`` seconds through
hyspec.bench.server_load's ``run_load`` (each stream well-formed, exactly max_tokens ids, equal token for
token to the same request run alone afterwards; nothing in flight and the KV pool empty at the end),
SIGKILLs the Ray draft worker's process at ``--kill-worker-at`` seconds, samples the server's and the
worker's resident memory every few seconds, then stops the server with SIGTERM and requires exit status 0.

``hyspec soak`` runs it (its options: hyspec.cli.soak).

Reported: requests, tokens, TTFT / latency p50 / p99, the server's RSS over time (start, after warm-up,
end, growth after warm-up), the kill and what the remote metrics say about it (failovers, rejoins, drafts by
source), and every problem found.  Exit status 0 only if nothing was wrong.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
from hyspec.bench.serve_process import ServerExited, free_port, wait_until_healthy
from hyspec.bench.server_load import run_load


def rss_bytes(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def draft_worker_pids() -> list[int]:
    """Processes of Ray actors hosting a hyspec DraftWorker (Ray names them ``ray::DraftWorker``)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        if b"ray::DraftWorker" in cmdline:
            pids.append(int(entry.name))
    return pids


def metric_values(text: str, name: str) -> dict[str, float]:
    """``{labels: value}`` of every sample of ``name`` in a Prometheus exposition."""
    out = {}
    for m in re.finditer(rf"^{re.escape(name)}(\{{[^}}]*\}})? (\S+)$", text, re.MULTILINE):
        out[m.group(1) or ""] = float(m.group(2))
    return out


class Sampler(threading.Thread):
    """The server's and the draft workers' RSS every ``interval`` seconds."""

    def __init__(self, server_pid: int, interval: float):
        super().__init__(daemon=True)
        self.server_pid, self.interval = server_pid, interval
        self.samples: list[dict[str, Any]] = []
        self.t0 = time.monotonic()
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            workers = {pid: rss_bytes(pid) for pid in draft_worker_pids()}
            self.samples.append({"t_s": round(time.monotonic() - self.t0, 1), "server_rss": rss_bytes(self.server_pid),
                                 "worker_rss": {str(k): v for k, v in workers.items()}})
            self._halt.wait(self.interval)

    def stop(self) -> None:
        self._halt.set()
        self.join()


def run_soak(args: argparse.Namespace) -> int:
    """One soak run with ``hyspec soak``'s options; 0 only if nothing was wrong."""
    kill_at = args.duration / 4 if args.kill_worker_at is None else args.kill_worker_at

    port = free_port()
    cmd = [sys.executable, "-m", "hyspec.cli.main", "serve", "--port", str(port), "--max-num-seqs", str(args.clients),
           "--max-queue", str(args.clients), "--speculative-config", args.speculative_config, "--log-level", "warning"]
    if args.model:
        cmd += ["--model", args.model]
    log_path = Path(args.log or (Path(args.json).with_suffix(".server.log") if args.json else f"/tmp/soak-{port}.log"))
    env = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}
    problems: list[str] = []
    with open(log_path, "w") as log:
        server = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        try:
            wait_until_healthy(url, server, 900, interval_s=1)
        except (ServerExited, TimeoutError):
            raise SystemExit(f"hyspec soak: the server did not start (see {log_path})") from None
        sampler = Sampler(server.pid, args.rss_interval)
        sampler.start()
        kill: dict[str, Any] = {"at_s": None, "pids": []}

        def killer() -> None:
            time.sleep(kill_at)
            pids = draft_worker_pids()
            for pid in pids:
                os.kill(pid, signal.SIGKILL)
            kill.update(at_s=round(time.monotonic() - sampler.t0, 1), pids=pids)

        if kill_at >= 0:
            threading.Thread(target=killer, daemon=True).start()
        report = asyncio.run(run_load(url, args.clients, args.duration, args.max_tokens,
                                      num_prompts=args.num_prompts, grace=600.0))
        sampler.stop()
        metrics = httpx.get(url + "/metrics", timeout=10).text
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            exit_code = server.wait(120)
        except subprocess.TimeoutExpired:
            server.kill()
            exit_code = server.wait()
    problems += report.problems
    if exit_code != 0:
        problems.append(f"hyspec serve exited with status {exit_code} after SIGTERM (see {log_path})")
    if kill_at >= 0 and not kill["pids"]:
        problems.append("no draft worker process was found to kill")
    rss = [(s["t_s"], s["server_rss"]) for s in sampler.samples if s["server_rss"]]
    after_warm = [r for t, r in rss if t >= args.warm_up_s] or [r for _, r in rss]
    remote = {name: metric_values(metrics, f"hyspec_remote_{name}_total")
              for name in ("failovers", "rejoins", "draft_timeouts", "drafts", "calls")}
    result = {
        "command": " ".join(cmd), "clients": args.clients, "duration_s": args.duration, "max_tokens": args.max_tokens,
        "requests": report.requests, "tokens": report.tokens, "tokens_per_s": round(report.tokens_per_s, 1),
        "wall_s": round(report.wall_s, 1), "ttft_p50_s": report.ttft_p50_s, "ttft_p99_s": report.ttft_p99_s,
        "latency_p50_s": report.latency_p50_s, "latency_p99_s": report.latency_p99_s,
        "kv_usage_after": report.kv_usage_after, "in_flight_after": report.in_flight_after,
        "server_rss_mb": {"start": round(rss[0][1] / 2**20, 1) if rss else None,
                          "after_warm_up": round(after_warm[0] / 2**20, 1) if after_warm else None,
                          "max": round(max(r for _, r in rss) / 2**20, 1) if rss else None,
                          "end": round(rss[-1][1] / 2**20, 1) if rss else None,
                          "growth_after_warm_up": round((after_warm[-1] - after_warm[0]) / 2**20, 1)
                          if after_warm else None},
        "worker_killed": kill, "remote_metrics": remote, "server_exit_code": exit_code,
        "problems": problems, "ok": not problems, "rss_samples": sampler.samples,
    }
    text = json.dumps(result, indent=1)
    print(json.dumps({k: v for k, v in result.items() if k != "rss_samples"}, indent=1))
    if args.json:
        Path(args.json).write_text(text)
    return 0 if not problems else 1

