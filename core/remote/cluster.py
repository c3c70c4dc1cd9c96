"""Joining Ray for remote drafting: connect to a cluster, or start a local one on demand.

``ray_address`` null starts a single-node Ray bound to 127.0.0.1 (no
dashboard, a small object store: messages are a few kilobytes) that
offers one draft worker slot; a process that already called ``ray.init``
keeps its instance.  A cluster address is checked with a plain TCP connect
first, so an unreachable head fails in seconds with a message naming it
instead of hanging inside ``ray.init``.
"""
from __future__ import annotations

import logging
import os
import socket
import threading

from hyspec.remote.transport import RemoteUnavailable
from hyspec.remote.worker import WORKER_RESOURCE

log = logging.getLogger(__name__)

LOCAL_OBJECT_STORE_BYTES = 100 << 20  # Ray's floor is 75 MiB; drafting messages are kilobytes
CONNECT_CHECK_TIMEOUT_S = 3.0
_lock = threading.Lock()


def connect(address: str | None) -> bool:
    """Make sure this process is connected to Ray; True when it started a local instance.

    Raises RemoteUnavailable (Ray missing, address unreachable or refused).
    """
    try:
        import ray
    except ImportError:
        raise RemoteUnavailable("remote drafting needs Ray: pip install 'hyspec[dist]'") from None
    with _lock:
        if ray.is_initialized():
            return False
        if address is None:
            ray.init(address="local", include_dashboard=False, num_cpus=os.cpu_count() or 1,
                     object_store_memory=LOCAL_OBJECT_STORE_BYTES, resources={WORKER_RESOURCE: 1},
                     _node_ip_address="127.0.0.1", log_to_driver=True)
            log.info("started a local Ray instance for remote drafting")
            return True
        _check_reachable(address)
        try:
            ray.init(address=address, log_to_driver=True)
        except Exception as exc:
            raise RemoteUnavailable(f"speculative_config.ray_address {address!r}: ray.init failed: {exc}") from None
        return False


def _check_reachable(address: str) -> None:
    from hyspec.backends.probe_dist import parse_ray_address

    target = parse_ray_address(address)  # ConfigError for malformed addresses
    if target is None:  # "auto": Ray finds the address itself
        return
    try:
        with socket.create_connection(target, timeout=CONNECT_CHECK_TIMEOUT_S):
            pass
    except OSError as exc:
        raise RemoteUnavailable(f"speculative_config.ray_address {address!r}: cannot reach "
                                f"{target[0]}:{target[1]}: {exc.strerror or type(exc).__name__}") from None


def worker_nodes(address: str | None) -> list[str | None]:
    """Where to start a method's workers: one per alive node offering ``WORKER_RESOURCE``.

    Each CPU node that joined with ``hyspec draft-worker`` offers it.  On a
    local instance without it (a process that called ``ray.init`` itself),
    ``[None]``: one worker wherever Ray puts it.
    """
    import ray

    nodes = [n["NodeID"] for n in ray.nodes() if n.get("Alive") and n.get("Resources", {}).get(WORKER_RESOURCE)]
    if nodes:
        return nodes
    if address is not None:
        raise RemoteUnavailable(f"no node of the Ray cluster at {address!r} offers the {WORKER_RESOURCE!r} "
                                "resource; join CPU nodes with `hyspec draft-worker --address ADDR`")
    return [None]
