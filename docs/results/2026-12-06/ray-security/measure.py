"""Which interfaces hyspec's Ray processes listen on, and whether a client without the token gets in.

    .venv/bin/python docs/results/2026-12-06/ray-security/measure.py before   # today's draft-worker flags
    .venv/bin/python docs/results/2026-12-06/ray-security/measure.py after    # --auth-token-file, --node-ip-address

1. The local Ray that ``hyspec.remote.cluster.connect(None)`` starts (what a
   target with ``draft_placement: "remote"`` and ``ray_address: null`` gets):
   ``ss -ltnp`` rows of the processes it started, the auth mode, whether a
   token file was written under $HOME, and a client with no token.
2. A head from ``ray start --head --node-ip-address=127.0.0.1`` with token
   auth, joined by ``hyspec draft-worker``: the listeners of both, then a
   client without the token and one with it.

Every Ray process is stopped by the process that started it (ray.shutdown, or
SIGTERM to a ``ray start --block``), never by ``ray stop``, which would stop
other users' Ray on a shared machine.  HOME is a temporary directory.
"""
from __future__ import annotations

import json
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BIN = Path(sys.executable).parent
RAY_VARS = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")

LOCAL_DRIVER = r"""
import json, os, sys
from hyspec.remote import cluster
cluster.connect(None)
import ray
print(json.dumps({"gcs": ray.get_runtime_context().gcs_address,
                  "auth_mode": os.environ.get("RAY_AUTH_MODE"), "token_in_env": bool(os.environ.get("RAY_AUTH_TOKEN"))}),
      flush=True)
sys.stdin.readline()  # the measuring process reads the listeners and tries a client meanwhile
ray.shutdown()
"""

CLIENT = """
import sys, ray
try:
    ray.init(address={address!r})
except Exception as exc:  # Ray wraps the cause (an AuthenticationError) in a ConnectionError
    cause = [ln for ln in str(exc.__cause__).splitlines() if ln.strip()] or [""]
    sys.exit(f"refused: {{type(exc).__name__}}: {{exc}}; cause: {{type(exc.__cause__).__name__}}, ending "
             f"{{cause[-1].strip()[:200]}}")
print('connected; resources:', {{k: v for k, v in ray.cluster_resources().items() if 'node' not in k}})
ray.shutdown()
"""


def listeners(pids: set[int]) -> list[str]:
    """``ss -ltnp`` rows whose process is one of ``pids``: 'process pid local-address:port (what it is)'."""
    import psutil

    rows = []
    for line in subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True).stdout.splitlines():
        for name, pid in re.findall(r'\("([^"]+)",pid=(\d+)', line):
            if int(pid) in pids:
                script = ""
                if name.startswith("python"):  # name what it runs
                    try:
                        args = psutil.Process(int(pid)).cmdline()[1:]
                    except psutil.Error:
                        args = []
                    first = next((a for a in args if a == "-c" or not a.startswith("-")), "")
                    script = "python -c (driver)" if first == "-c" else Path(first).name
                rows.append(f"{name:<18} pid {pid:>7}  listens on {line.split()[3]:<22} {script}".rstrip())
    return sorted(rows)


def leftovers(marker: str, timeout_s: float = 60) -> str:
    """Ray processes of this run still alive ``timeout_s`` after their starter was stopped."""
    end = time.monotonic() + timeout_s
    while (left := ray_pids(marker)) and time.monotonic() < end:
        time.sleep(1)
    if not left:
        return "none"
    for pid in left:  # this run's own processes: stop them by id
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return f"{len(left)} processes still running after {timeout_s:.0f} s (killed): {sorted(left)}"


def ray_pids(marker: str) -> set[int]:
    """Processes whose command line mentions ``marker`` (this run's temporary directory), and their children."""
    import psutil

    found = set()
    for proc in psutil.process_iter(["pid", "cmdline"]):
        if marker in " ".join(proc.info["cmdline"] or []):
            found.add(proc.pid)
            found |= {c.pid for c in proc.children(recursive=True)}
    return found


def client(address: str, env: dict) -> str:
    try:
        r = subprocess.run([sys.executable, "-c", CLIENT.format(address=address)], env=env, capture_output=True,
                           text=True, timeout=120)
    except subprocess.TimeoutExpired:
        return "no answer in 120 s"
    if r.returncode == 0:
        return r.stdout.strip().splitlines()[-1]
    last = [ln for ln in r.stderr.strip().splitlines() if "refused" in ln or "Error" in ln] or ["?"]
    return f"exit {r.returncode}: {last[-1][:400]}"


def clean_env(home: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in RAY_VARS}
    env["HOME"] = str(home)
    return env


def measure_local(tmp: Path) -> None:
    home = tmp / "home_local"
    home.mkdir()
    env = clean_env(home)
    print("## 1. local Ray started by hyspec.remote.cluster.connect(None)")
    driver = subprocess.Popen([sys.executable, "-c", LOCAL_DRIVER], env=env, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    info = json.loads(driver.stdout.readline())
    time.sleep(2)  # the idle workers' listeners open a little after ray.init returns
    print(f"driver's RAY_AUTH_MODE after connect: {info['auth_mode']}; token in its environment: "
          f"{info['token_in_env']}; GCS address Ray reports: {info['gcs']}")
    token_file = home / ".ray" / "auth_token"
    print(f"token file written under HOME: {token_file.exists()}"
          + (f" (mode {oct(token_file.stat().st_mode & 0o777)})" if token_file.exists() else ""))
    import psutil

    pids = {driver.pid} | {p.pid for p in psutil.Process(driver.pid).children(recursive=True)}
    for row in listeners(pids):
        print("  " + row)
    other_home = tmp / "home_client"
    other_home.mkdir()
    print(f"client with no token (another HOME): {client(info['gcs'], clean_env(other_home))}")
    driver.stdin.write("\n")
    driver.stdin.flush()
    print(f"driver exit status: {driver.wait(120)}")


def wait_port(port: int, proc: subprocess.Popen, timeout_s: float = 120) -> None:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end and proc.poll() is None:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.5)
    raise SystemExit(f"head did not listen on {port} (exit {proc.poll()})")


def stop(proc: subprocess.Popen) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


def measure_join(tmp: Path, label: str) -> None:
    home = tmp / "home_join"
    home.mkdir()
    token = tmp / "cluster_token"
    token.write_text(secrets.token_urlsafe(32))
    token.chmod(0o600)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    address = f"127.0.0.1:{port}"
    print(f"\n## 2. head on {address} with token auth, joined by hyspec draft-worker ({label})")
    secured = {**clean_env(home), "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token)}
    head = subprocess.Popen([str(BIN / "ray"), "start", "--head", f"--port={port}", "--node-ip-address=127.0.0.1",
                             "--include-dashboard=false", "--num-cpus=1", f"--temp-dir={tmp / 'ray'}",
                             "--disable-usage-stats", "--block"], env=secured, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    worker = None
    try:
        wait_port(port, head)
        if label == "before":  # today's draft-worker has no token flag: the operator's environment carries it
            cmd, worker_env = [str(BIN / "hyspec"), "draft-worker", "--address", address, "--num-cpus=1"], secured
        else:
            cmd = [str(BIN / "hyspec"), "draft-worker", "--address", address, "--num-cpus=1",
                   "--auth-token-file", str(token), "--node-ip-address=127.0.0.1"]
            worker_env = clean_env(home)
        print("$ " + " ".join(cmd))
        worker = subprocess.Popen(cmd, env=worker_env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        joined = "no"
        for _ in range(30):
            joined = client(address, secured)
            if "hyspec_draft" in joined or worker.poll() is not None:
                break
            time.sleep(2)
        print(f"client with the token: {joined}")
        for row in listeners(ray_pids(str(tmp / "ray")) | {head.pid, worker.pid}):
            print("  " + row)
        print(f"client with no token: {client(address, clean_env(home))}")
        if label == "after":
            bare = subprocess.run([str(BIN / "hyspec"), "draft-worker", "--address", address, "--dry-run"],
                                  env=clean_env(home), capture_output=True, text=True)
            print(f"draft-worker without a token: exit {bare.returncode}: {bare.stderr.strip()}")
    finally:
        codes = {name: stop(p) for name, p in (("draft-worker", worker), ("head", head)) if p is not None}
        print(f"exit status after SIGTERM: {codes} (`ray start --block` exits 1 on a signal)")
        print(f"Ray processes of this run left behind: {leftovers(str(tmp / 'ray'))}")


def main() -> None:
    label = sys.argv[1] if len(sys.argv) > 1 else "after"
    if label not in ("before", "after"):
        raise SystemExit("usage: measure.py before|after")
    import ray

    print(f"# ray {ray.__version__}, {label}; host addresses: "
          + subprocess.run(["hostname", "-I"], capture_output=True, text=True).stdout.strip())
    with tempfile.TemporaryDirectory(prefix="hyspec-ray-security-") as tmp:
        measure_local(Path(tmp))
        measure_join(Path(tmp), label)


if __name__ == "__main__":
    main()
