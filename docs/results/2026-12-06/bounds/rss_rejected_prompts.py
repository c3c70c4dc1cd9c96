"""RSS of a `hyspec serve` process (the default model, CPU backend) before and after rejected 10 MB prompts,
and how long /health took while they were handled (issue 50, item 1).

    python docs/results/2026-12-06/bounds/rss_rejected_prompts.py --out docs/results/2026-12-06/bounds/runs.json --key after
    PYTHONPATH=/tmp/old_hyspec python docs/results/2026-12-06/bounds/rss_rejected_prompts.py --out docs/results/2026-12-06/bounds/runs.json --key before

(the second runs an older tree: ``git archive <commit> core | tar -x -C /tmp/old_hyspec`` and rename its
``core`` to ``hyspec``).  Each prompt is one request of ``--chars`` characters; the server refuses it with a 400.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=10)
    parser.add_argument("--chars", type=int, default=10_000_000)
    parser.add_argument("--settle", type=float, default=3.0, help="seconds to wait before the last RSS reading")
    parser.add_argument("--out", required=True)
    parser.add_argument("--key", help="file the result under this key of --out, keeping its other keys")
    args = parser.parse_args()

    port = free_port()
    env = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}
    env.pop("HYSPEC_API_KEY", None)
    proc = subprocess.Popen([sys.executable, "-m", "hyspec.cli.main", "serve", "--backend", "cpu", "--port", str(port),
                             "--log-level", "warning"], env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            try:
                if httpx.get(url + "/health", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or proc.poll() is not None:
                raise SystemExit("the server did not start")
            time.sleep(0.5)
        httpx.post(url + "/v1/completions", json={"prompt": "warm up", "max_tokens": 2}, timeout=120)
        before = rss_mib(proc.pid)
        prompt = ("lorem ipsum " * (args.chars // 12 + 1))[:args.chars]
        health: list[float] = []
        done = threading.Event()

        def poll_health() -> None:
            while not done.is_set():  # a new connection each time: a stalled server drops idle keep-alives
                t0 = time.monotonic()
                httpx.get(url + "/health", timeout=120)
                health.append(time.monotonic() - t0)
                time.sleep(0.05)

        poller = threading.Thread(target=poll_health)
        poller.start()
        statuses, seconds, peak = [], [], before
        for _ in range(args.requests):
            t0 = time.monotonic()
            r = httpx.post(url + "/v1/completions", json={"prompt": prompt, "max_tokens": 4}, timeout=600)
            seconds.append(round(time.monotonic() - t0, 3))
            statuses.append(r.status_code)
            peak = max(peak, rss_mib(proc.pid))
        done.set()
        poller.join()
        time.sleep(args.settle)
        after = rss_mib(proc.pid)
        result = {"python": sys.version.split()[0], "hyspec": __import__("hyspec").__file__,
                  "requests": args.requests, "chars": args.chars, "statuses": statuses,
                  "request_seconds": seconds, "rss_mib_before": round(before, 1), "rss_mib_peak_seen": round(peak, 1),
                  "rss_mib_after": round(after, 1), "health_max_seconds": round(max(health), 3),
                  "health_answers": len(health)}
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=120)
    result["server_exit_code"] = code
    print(json.dumps(result, indent=1))
    document: dict = result
    if args.key:
        if os.path.exists(args.out):
            with open(args.out) as f:
                document = json.load(f)
        else:
            document = {}
        document[args.key] = result
    with open(args.out, "w") as f:
        json.dump(document, f, indent=1)


if __name__ == "__main__":
    main()
