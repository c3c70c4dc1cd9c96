"""Run the README's copy of vLLM's quickstart literally (its `hyspec export-hf`, `hyspec serve` and two curls),
in a fresh temporary directory, and write what each command printed to quickstart.json.

    .venv/bin/python docs/results/2026-12-06/vllm-quickstart/run.py

The only addition: after the `hyspec serve ... &` line it waits for /health before the curls (the quickstart
runs the server and the queries in two terminals).
"""
from __future__ import annotations

import json
import os
import platform
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[4]
OUT = Path(__file__).with_name("quickstart.json")


def block() -> str:
    text = (REPO / "README.md").read_text()
    return re.search(r"<!-- vllm-quickstart[^>]*-->\s*```bash\n(.*?)```", text, re.DOTALL).group(1)


def main() -> int:
    bin_dir = Path(sys.executable).parent
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}
    steps, server = [], None
    with tempfile.TemporaryDirectory() as work:
        try:
            for command in re.split(r"\n(?=\S)", block().strip()):  # commands start at column 0
                t0 = time.perf_counter()
                if command.rstrip().endswith("&"):
                    server = subprocess.Popen(shlex.split(command.rstrip(" &")), cwd=work, env=env,
                                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                    deadline = time.monotonic() + 300
                    while True:
                        try:
                            if httpx.get("http://localhost:8000/health", timeout=2).status_code == 200:
                                break
                        except httpx.HTTPError:
                            pass
                        if server.poll() is not None or time.monotonic() > deadline:
                            raise RuntimeError(f"the server did not come up: {server.communicate()[0][-3000:]}")
                        time.sleep(0.5)
                    steps.append({"command": command, "seconds_to_healthy": round(time.perf_counter() - t0, 1)})
                    continue
                r = subprocess.run(["bash", "-c", command], cwd=work, env=env, capture_output=True, text=True,
                                   timeout=600)
                steps.append({"command": command, "returncode": r.returncode,
                              "seconds": round(time.perf_counter() - t0, 1),
                              "stdout": r.stdout[-4000:],
                              # curl's progress meter is noise; kept only when a command fails
                              **({"stderr": r.stderr[-2000:]} if r.returncode else {})})
                if r.returncode != 0:
                    raise RuntimeError(f"{command!r} failed: {r.stderr[-2000:]}")
        finally:
            if server is not None and server.poll() is None:
                server.send_signal(signal.SIGTERM)
                log = server.communicate(timeout=60)[0]
                steps.append({"server_exit": server.returncode, "server_log_tail": log[-2000:]})
    OUT.write_text(json.dumps({"machine": f"{platform.node()} {platform.machine()}, {os.cpu_count()} CPUs "
                                          "(shared with other jobs while it ran)",
                               "python": sys.version.split()[0], "steps": steps}, indent=1) + "\n")
    print(json.dumps(steps, indent=1)[-3000:])
    return 0


if __name__ == "__main__":
    sys.exit(main())
