"""Join this CPU node to a Ray cluster as a hyspec draft worker node.

On every CPU node that should draft for the targets of the cluster::

    hyspec draft-worker --address HEAD_IP:6379 [--num-cpus N] [--resources '{"avx512": 1}']

runs ``ray start --address HEAD_IP:6379 --num-cpus N --resources '{"hyspec_draft": 1, ...}' --block``.
The ``hyspec_draft`` resource is what places draft workers: a target whose
speculative_config says ``"draft_placement": "remote", "ray_address":
"HEAD_IP:6379"`` starts one worker actor per node offering it, and the
adaptive scheduler gives each up to the node's cores.  The node needs
hyspec installed and the drafter's weights at the path the config names
(or the embedded default drafter); it never needs the target's weights.
``--dry-run`` prints the command instead of running it.
"""
from __future__ import annotations

import argparse
import json
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from hyspec.errors import ConfigError
from hyspec.remote.worker import WORKER_RESOURCE  # torch-free module


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--address", required=True, metavar="HOST:PORT",
                        help="the Ray head's GCS address (the ray_address of the targets' speculative_config)")
    parser.add_argument("--num-cpus", type=int, default=None, metavar="N",
                        help="cores this node gives to drafting (default: Ray counts them)")
    parser.add_argument("--resources", default=None, metavar="JSON",
                        help='extra custom Ray resources of this node, e.g. \'{"avx512": 1}\'')
    parser.add_argument("--no-block", action="store_true",
                        help="start the Ray node daemon and return instead of staying in the foreground")
    parser.add_argument("--dry-run", action="store_true", help="print the ray start command and exit")


def ray_start_command(address: str, num_cpus: int | None, resources: str | None, block: bool) -> list[str]:
    """The ``ray start`` invocation that joins this node as a draft worker node."""
    from hyspec.backends.probe_dist import parse_ray_address

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
    ray = Path(sys.executable).with_name("ray")
    cmd = [str(ray) if ray.is_file() else (shutil.which("ray") or "ray"), "start", f"--address={address}",
           f"--resources={json.dumps({WORKER_RESOURCE: 1, **extra})}"]
    if num_cpus is not None:
        cmd.append(f"--num-cpus={num_cpus}")
    if block:
        cmd.append("--block")
    return cmd


def run(args: argparse.Namespace) -> int:
    cmd = ray_start_command(args.address, args.num_cpus, args.resources, block=not args.no_block)
    if args.dry_run:
        print(shlex.join(cmd))
        return 0
    print(f"joining {args.address} as a hyspec draft worker node: {shlex.join(cmd)}", file=sys.stderr)
    try:
        return subprocess.run(cmd).returncode
    except FileNotFoundError:
        print("hyspec draft-worker: error: the `ray` command is missing; pip install 'hyspec[dist]'", file=sys.stderr)
        return 2
