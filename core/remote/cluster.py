"""Joining Ray for remote drafting: connect to a cluster, or start a local one on demand, token auth on.

``ray_address`` null starts a single-node Ray (no dashboard, a small object
store: messages are a few kilobytes) that offers one draft worker slot; a
process that already called ``ray.init`` keeps its instance.  Ray's core
gRPC servers listen on all interfaces whatever node IP is asked for (Ray
replaces 127.0.0.1 by the host's routable address), so the local instance
gets Ray's token authentication with a fresh token held in this process's
environment, or the operator's (``RAY_AUTH_TOKEN`` / ``RAY_AUTH_TOKEN_PATH``).
Connecting to a cluster needs its token; ``RAY_AUTH_MODE=disabled`` in the
environment is the operator's explicit opt-out, logged.  A cluster address
is checked with a plain TCP connect first, so an unreachable head fails in
seconds with a message naming it instead of hanging inside ``ray.init``.
docs/remote_security.md covers the rest (TLS, firewalls, who may join).
"""
from __future__ import annotations

import logging
import os
import socket
import threading

from hyspec.backends.probe_dist import parse_ray_address
from hyspec.remote import ray_security
from hyspec.remote.transport import RemoteUnavailable
from hyspec.remote.worker import WORKER_RESOURCE

log = logging.getLogger(__name__)

LOCAL_OBJECT_STORE_BYTES = 100 << 20  # Ray's floor is 75 MiB; drafting messages are kilobytes
CONNECT_CHECK_TIMEOUT_S = 3.0
_lock = threading.Lock()


def connect(address: str | None) -> bool:
    """Make sure this process is connected to Ray; True when it started a local instance.

    Raises RemoteUnavailable (Ray missing, no token for a cluster, address
    unreachable or refused).
    """
    try:
        import ray
    except ImportError:
        raise RemoteUnavailable("remote drafting needs Ray: pip install 'hyspec[dist]'") from None
    with _lock:
        _no_implicit_connect()
        if ray.is_initialized():
            return False
        if address is None:
            _secure_environment(ray_security.local_cluster_env, "a local Ray")
            ray.init(address="local", include_dashboard=False, num_cpus=os.cpu_count() or 1,
                     object_store_memory=LOCAL_OBJECT_STORE_BYTES, resources={WORKER_RESOURCE: 1},
                     log_to_driver=True)
            log.info("started a local Ray instance for remote drafting (auth mode %s)",
                     os.environ.get(ray_security.AUTH_MODE))
            return True
        _secure_environment(ray_security.connecting_env, f"speculative_config.ray_address {address!r}")
        _check_reachable(address)
        try:
            ray.init(address=address, log_to_driver=True)
        except Exception as exc:
            raise RemoteUnavailable(f"speculative_config.ray_address {address!r}: ray.init failed: {exc}") from None
        return False


def _no_implicit_connect() -> None:
    """Turn off Ray's auto-init in this process: hyspec connects here, explicitly, or not at all.

    Otherwise a Ray call after ``ray.shutdown`` (a worker handle closed late)
    runs ``ray.init()``, which joins whichever cluster
    /tmp/ray/ray_current_cluster names -- another user's on a shared host --
    and sends it pickled calls.  Ray reads the variable at import (children)
    and the module flag at each call (this process).
    """
    from ray._private import auto_init_hook

    os.environ["RAY_ENABLE_AUTO_CONNECT"] = "0"
    auto_init_hook.enable_auto_connect = False


def _secure_environment(settings, what: str) -> None:
    """Put Ray's auth variables for ``what`` into this process's environment, before ``ray.init`` reads them."""
    try:
        updates = settings(os.environ)
    except ray_security.RaySecurityError as exc:
        raise RemoteUnavailable(f"{what}: {exc}") from None
    if not updates:
        log.warning("%s: Ray token authentication is off (RAY_AUTH_MODE=disabled in the environment): whoever "
                    "reaches the Ray ports can run code in this process's cluster", what)
        return
    os.environ.update(updates)
    _reload_ray_auth_config()


def _reload_ray_auth_config() -> None:
    """Make an already imported Ray see the variables just set.

    Ray reads RAY_AUTH_MODE into its config and caches the token when it is
    imported; ray.init does the same reload when it turns token auth on by
    itself (Ray >= 2.59).  Without it the processes Ray starts demand the
    token and this driver does not send it.
    """
    from ray._raylet import AuthenticationTokenLoader, Config

    Config.initialize("")
    AuthenticationTokenLoader.instance().reset_cache()


def _check_reachable(address: str) -> None:
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
