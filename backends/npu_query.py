"""Ask torch_npu about its devices; runs in a child process (``main``) or in-process.

A broken torch_npu can raise, hang or crash the interpreter while being
imported, so the probe imports it here in a child process (``python -c``) and
reads one marked JSON line from its stdout (how far it got, what it found);
the traceback of a failure goes to stderr as usual, where the parent parses it.  This module imports only the
standard library at module level (``hyspec`` and ``hyspec.backends`` are light).
"""
from __future__ import annotations

import json
import sys
import traceback
from typing import Any

#: Prefix of the result line on the child's stdout (torch_npu may print other lines).
MARK = "HYSPEC_NPU_PROBE:"
CHILD_CODE = "from hyspec.backends.npu_query import main; main()"


def query_devices(torch_npu: Any) -> dict[str, Any]:
    """Device count, names, memory and SoC version from an imported torch_npu."""
    npu = torch_npu.npu
    count = int(npu.device_count())
    out: dict[str, Any] = {"device_count": count, "devices": []}
    for index in range(count):
        props = npu.get_device_properties(index)
        total = getattr(props, "total_memory", None)
        out["devices"].append({"index": index, "name": str(npu.get_device_name(index)),
                               "total_memory_bytes": int(total) if total is not None else None})
    if count:
        try:
            # the SoC enum (c10_npu::SocVersion): 220-225 = 910B, 250-255 = 910_93, ...
            out["soc_version"] = int(torch_npu._C._npu_get_soc_version())
        except Exception as exc:  # private API: a missing one costs the SoC number, not the probe
            out["soc_error"] = f"{type(exc).__name__}: {exc}"
    return out


def query_ops() -> dict[str, Any]:
    """hyspec.npu_ops.plan's choice per op (signatures, documented limits, one ATB call), or why it failed."""
    try:
        from hyspec.npu_ops import npu_op_plan

        return npu_op_plan()
    except Exception as exc:  # the device answered; a failing plan costs the op report, not the probe
        return {"error": f"{type(exc).__name__}: {exc}"}


def main() -> None:
    """Child process: import torch, then torch_npu, then query; print one marked JSON line."""
    result: dict[str, Any] = {"stage": "import torch"}
    code = 0
    try:
        import torch

        result["torch_version"] = torch.__version__
        result["stage"] = "import torch_npu"
        import torch_npu

        result["torch_npu_version"] = getattr(torch_npu, "__version__", None)
        result["stage"] = "query devices"
        result.update(query_devices(torch_npu))
        if result.get("device_count"):
            result["stage"] = "plan ops"
            result["ops"] = query_ops()
        result["stage"] = "done"
    except BaseException:  # noqa: BLE001 - report every failure, SystemExit from a broken package too
        sys.stderr.write(traceback.format_exc())
        sys.stderr.flush()
        code = 3
    sys.stdout.write(MARK + json.dumps(result) + "\n")
    sys.stdout.flush()
    sys.exit(code)


if __name__ == "__main__":
    main()
