"""Probe the distributed side: is Ray installed, and what does a given cluster hold?

Ray is never imported in this process (it is slow to import and installs
signal handlers); reading a cluster happens in a child process with a timeout.
"""
from __future__ import annotations

import json
import socket
import subprocess
import sys
from urllib.parse import urlsplit

from hyspec.backends.installed import dist_version
from hyspec.backends.ray_query import CHILD_CODE, MARK
from hyspec.backends.records import DistCapabilities, RayNode
from hyspec.errors import ConfigError

DEFAULT_TIMEOUT_S = 60.0
GCS_PORT, CLIENT_PORT = 6379, 10001
HINT_RAY = "pip install 'hyspec[dist]'"


def parse_ray_address(address: str) -> tuple[str, int] | None:
    """(host, port) to check reachability for, None for "auto"; bad input raises ConfigError."""
    address = address.strip()
    if address == "auto":
        return None
    if address in ("", "local"):
        raise ConfigError("--ray-address", f"{address!r} is not a cluster address; give host:port "
                          "(GCS, default port 6379), ray://host:port (Ray Client) or auto "
                          "(the probe never starts a cluster)")
    client = address.startswith("ray://")
    parts = urlsplit(address if client else f"//{address}")
    try:
        port = parts.port
    except ValueError:
        port = -1
    if not parts.hostname or port == -1 or (parts.path not in ("", "/")):
        raise ConfigError("--ray-address", f"{address!r} is not host:port, ray://host:port or auto")
    return parts.hostname, port if port is not None else (CLIENT_PORT if client else GCS_PORT)


def _unreachable(host: str, port: int, timeout_s: float = 3.0) -> str | None:
    """Why a TCP connection to host:port fails, or None when it opens."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return None
    except OSError as exc:
        return exc.strerror or type(exc).__name__


def probe_dist(ray_address: str | None = None, timeout_s: float = DEFAULT_TIMEOUT_S) -> DistCapabilities:
    version = dist_version("ray")
    if ray_address is None:
        return DistCapabilities(ray_installed=version is not None, ray_version=version, address=None,
                                connected=None, reason=None)
    target = parse_ray_address(ray_address)

    def failed(reason: str) -> DistCapabilities:
        return DistCapabilities(ray_installed=version is not None, ray_version=version, address=ray_address,
                                connected=False, reason=reason)

    if version is None:
        return failed(f"ray is not installed ({HINT_RAY})")
    if target is not None:
        why = _unreachable(*target)
        if why is not None:
            return failed(f"cannot reach the Ray cluster at {target[0]}:{target[1]}: {why}")
    try:
        proc = subprocess.run([sys.executable, "-c", CHILD_CODE, ray_address.strip()], capture_output=True,
                              text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return failed(f"connecting to the Ray cluster at {ray_address} did not finish within {timeout_s:g} s")
    lines = [line[len(MARK):] for line in proc.stdout.splitlines() if line.startswith(MARK)]
    if not lines:
        tail = proc.stderr.strip().splitlines()[-1:] or [f"exit code {proc.returncode}"]
        return failed(f"reading the Ray cluster at {ray_address} failed: {tail[0]}")
    result = json.loads(lines[-1])
    if not result["ok"]:
        return failed(f"cannot connect to the Ray cluster at {ray_address}: {result['error']}")
    nodes = tuple(RayNode(node_id=n["node_id"], address=n["address"], alive=n["alive"],
                          resources=tuple(sorted(n["resources"].items()))) for n in result["nodes"])
    resources = tuple(sorted(result["cluster_resources"].items()))
    return DistCapabilities(ray_installed=True, ray_version=version, address=ray_address, connected=True,
                            reason=None, nodes=nodes, cluster_resources=resources)
