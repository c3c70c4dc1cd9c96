"""Join this CPU node to a Ray cluster as a hyspec draft worker node, with Ray's token auth on.

On every CPU node that should draft for the targets of the cluster::

    hyspec draft-worker --address HEAD_IP:6379 --auth-token-file /etc/hyspec/ray_token \
        [--node-ip-address THIS_NODE_PRIVATE_IP] [--num-cpus N] [--resources '{"avx512": 1}']

runs ``RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH=... ray start --address HEAD_IP:6379
--node-ip-address IP --resources '{"hyspec_draft": 1, ...}' --block``.
The ``hyspec_draft`` resource is what places draft workers: a target whose
speculative_config says ``"draft_placement": "remote", "ray_address":
"HEAD_IP:6379"`` starts one worker actor per node offering it, and the
adaptive scheduler gives each up to the node's cores.  The node needs
hyspec installed and the drafter's weights at the path the config names
(or the embedded default drafter); it never needs the target's weights.

Security (docs/remote_security.md): whoever reaches a Ray cluster's ports
runs code on all of its nodes, so draft-worker refuses to join without the
cluster's token (``--auth-token-file``, or Ray's own ``RAY_AUTH_TOKEN`` /
``RAY_AUTH_TOKEN_PATH`` / ``~/.ray/auth_token``) unless ``--insecure-no-auth``
says so, and refuses a public node address unless ``--allow-public-ip`` does.
The node address defaults to this host's address on the route to the head
(the private interface facing it).  TLS is Ray's: export ``RAY_USE_TLS=1``
and the ``RAY_TLS_*`` files, which are checked here.
``--dry-run`` prints the command instead of running it.
"""
from __future__ import annotations

import argparse
import ipaddress
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from hyspec.errors import ConfigError
from hyspec.remote import ray_security
from hyspec.remote.worker import WORKER_RESOURCE  # torch-free module
from hyspec.backends.probe_dist import parse_ray_address


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--address", required=True, metavar="HOST:PORT",
                        help="the Ray head's GCS address (the ray_address of the targets' speculative_config)")
    parser.add_argument("--num-cpus", type=int, default=None, metavar="N",
                        help="cores this node gives to drafting (default: Ray counts them)")
    parser.add_argument("--resources", default=None, metavar="JSON",
                        help='extra custom Ray resources of this node, e.g. \'{"avx512": 1}\'')
    parser.add_argument("--node-ip-address", default=None, metavar="IP",
                        help="this node's address in the cluster, on a private interface (default: the address "
                             "this host uses to reach the head)")
    parser.add_argument("--allow-public-ip", action="store_true",
                        help="accept a public (globally routed) --node-ip-address")
    parser.add_argument("--auth-token-file", default=None, metavar="PATH",
                        help="file holding the cluster's Ray auth token (default: RAY_AUTH_TOKEN, "
                             "RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token)")
    parser.add_argument("--insecure-no-auth", action="store_true",
                        help="join without Ray token authentication: anyone reaching the cluster's ports "
                             "can then run code on this node")
    parser.add_argument("--no-block", action="store_true",
                        help="start the Ray node daemon and return instead of staying in the foreground")
    parser.add_argument("--dry-run", action="store_true", help="print the ray start command and exit")


def ray_start_command(address: str, num_cpus: int | None, resources: str | None, block: bool,
                      node_ip_address: str | None = None, allow_public_ip: bool = False) -> list[str]:
    """The ``ray start`` invocation that joins this node as a draft worker node."""
    try:
        target = parse_ray_address(address)
    except ConfigError as exc:
        raise ConfigError("--address", str(exc).split(": ", 1)[-1]) from None
    if target is None or address.startswith("ray://"):
        raise ConfigError("--address", f"{address!r}: give the head's GCS address HOST:PORT "
                                       "(a worker node joins the cluster itself, not through Ray Client)")
    extra: dict = {}
    if resources is not None:
        try:
            extra = json.loads(resources)
        except json.JSONDecodeError as exc:
            raise ConfigError("--resources", f"not JSON: {exc}") from None
        if not isinstance(extra, dict) or not all(isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0
                                                  for v in extra.values()):
            raise ConfigError("--resources", "expected a JSON object of resource name -> non-negative number")
        if WORKER_RESOURCE in extra:
            raise ConfigError("--resources", f"{WORKER_RESOURCE!r} is set by draft-worker itself (one per node)")
    if num_cpus is not None and num_cpus < 1:
        raise ConfigError("--num-cpus", f"must be at least 1, got {num_cpus}")
    node_ip = _checked_node_ip(node_ip_address or _address_towards(target), allow_public_ip)
    ray = Path(sys.executable).with_name("ray")
    cmd = [str(ray) if ray.is_file() else (shutil.which("ray") or "ray"), "start", f"--address={address}",
           f"--node-ip-address={node_ip}", f"--resources={json.dumps({WORKER_RESOURCE: 1, **extra})}"]
    if num_cpus is not None:
        cmd.append(f"--num-cpus={num_cpus}")
    if block:
        cmd.append("--block")
    return cmd


def _address_towards(target: tuple[str, int]) -> str:
    """This host's address on the route to ``target``: a UDP connect picks the interface and sends nothing."""
    try:
        family, _, _, _, sockaddr = socket.getaddrinfo(target[0], target[1], type=socket.SOCK_DGRAM)[0]
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.connect(sockaddr)
            return s.getsockname()[0]
    except OSError as exc:
        raise ConfigError("--node-ip-address", f"cannot find this host's address towards {target[0]}:{target[1]} "
                                               f"({exc.strerror or exc}); give it") from None


def _checked_node_ip(node_ip: str, allow_public_ip: bool) -> str:
    try:
        ip = ipaddress.ip_address(node_ip)
    except ValueError:
        raise ConfigError("--node-ip-address", f"{node_ip!r} is not an IP address") from None
    if ip.is_unspecified:
        raise ConfigError("--node-ip-address", f"{node_ip}: give one interface's address, not 'any'")
    if ip.is_global and not allow_public_ip:
        raise ConfigError("--node-ip-address", f"{node_ip} is a public address: Ray's ports would face the "
                                               "internet; use a private interface, or pass --allow-public-ip")
    return str(ip)


def ray_start_env(environ: Mapping[str, str], token_file: str | None, insecure: bool) -> dict[str, str]:
    """The environment ``ray start`` runs in: token auth on, with a token; ConfigError names what is missing."""
    env = dict(environ)
    if token_file is not None:
        env[ray_security.AUTH_TOKEN_PATH] = token_file
        env.pop(ray_security.AUTH_TOKEN, None)  # Ray prefers the value to the file
    try:
        return ray_security.joining_env(env, insecure)
    except ray_security.RaySecurityError as exc:
        if exc.variable in (ray_security.AUTH_TOKEN, ray_security.AUTH_TOKEN_PATH):
            raise ConfigError("--auth-token-file", exc.message if exc.variable == ray_security.AUTH_TOKEN
                              else str(exc)) from None
        raise ConfigError(exc.variable, exc.message) from None


def _shown(cmd: list[str], env: Mapping[str, str]) -> str:
    """The command as a shell line, with the Ray settings it runs under (never the token itself)."""
    names = (ray_security.AUTH_MODE, ray_security.AUTH_TOKEN_PATH, ray_security.USE_TLS, *ray_security.TLS_FILES)
    return shlex.join([f"{n}={env[n]}" for n in names if env.get(n)] + cmd)


def run(args: argparse.Namespace) -> int:
    cmd = ray_start_command(args.address, args.num_cpus, args.resources, block=not args.no_block,
                            node_ip_address=args.node_ip_address, allow_public_ip=args.allow_public_ip)
    env = ray_start_env(os.environ, args.auth_token_file, args.insecure_no_auth)
    if args.dry_run:
        print(_shown(cmd, env))
        return 0
    if args.insecure_no_auth:
        print("hyspec draft-worker: warning: joining WITHOUT Ray token authentication (--insecure-no-auth): "
              "anyone who reaches the cluster's ports can run code on this node", file=sys.stderr)
    print(f"joining {args.address} as a hyspec draft worker node: {_shown(cmd, env)}", file=sys.stderr)
    try:
        child = subprocess.Popen(cmd, env=env)
    except FileNotFoundError:
        print("hyspec draft-worker: error: the `ray` command is missing; pip install 'hyspec[dist]'", file=sys.stderr)
        return 2
    return _wait_forwarding_signals(child)


def _wait_forwarding_signals(child: subprocess.Popen) -> int:
    """Wait for ``ray start``; SIGTERM/SIGINT go to it, so that it stops the Ray processes it started.

    A node stopped that way has done what was asked: exit 0 (``ray start
    --block`` itself exits 1 on a signal).
    """
    stopped = []

    def forward(signum, _frame):
        stopped.append(signum)
        child.send_signal(signum)

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        code = child.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0 if stopped else code
