"""Read a running Ray cluster's nodes and resources; runs in a child process.

``ray.init(address=...)`` to an unreachable cluster retries for minutes, so
the probe runs this in a child with a timeout.  It only connects: an address
is always given, so no cluster is started.  Standard library only at module level.
"""
from __future__ import annotations

import json
import sys
import traceback
from typing import Any

MARK = "HYSPEC_RAY_PROBE:"
CHILD_CODE = "from hyspec.backends.ray_query import main; main()"


def read_cluster(address: str) -> dict[str, Any]:
    import ray

    ray.init(address=address, logging_level="ERROR", log_to_driver=False)
    try:
        nodes = [{"node_id": str(n.get("NodeID", "")), "address": str(n.get("NodeManagerAddress", "")),
                  "alive": bool(n.get("Alive", False)),
                  "resources": {k: float(v) for k, v in (n.get("Resources") or {}).items()}}
                 for n in ray.nodes()]
        resources = {k: float(v) for k, v in ray.cluster_resources().items()}
    finally:
        ray.shutdown()
    return {"nodes": nodes, "cluster_resources": resources}


def main() -> None:
    """Child process: ``python -c CHILD_CODE ADDRESS``; prints one marked JSON line."""
    address = sys.argv[1]
    try:
        result: dict[str, Any] = {"ok": True, **read_cluster(address)}
    except BaseException as exc:  # noqa: BLE001 - every failure becomes a reason, never a traceback
        traceback.print_exc()
        result = {"ok": False, "error": f"{type(exc).__name__}: {exc}".strip().splitlines()[0]}
    sys.stdout.write(MARK + json.dumps(result) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
