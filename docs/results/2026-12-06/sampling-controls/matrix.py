"""Method x sampling control at temperature 0: are the tokens plain decoding's?  Writes matrix.json.

    TORCH_DEVICE_BACKEND_AUTOLOAD=0 .venv/bin/python docs/results/2026-12-06/sampling-controls/matrix.py \
        [--methods ngram suffix] [--prompts 4] [--max-tokens 24] [--out matrix.json]

Every method of the conformance suite (random drafters on the tiny target, CPU, fp32) with each control
of hyspec.conformance.controls; the same function the slow test
tests/spec/test_controls_identity.py::test_every_method_with_every_control_identical_to_plain runs.
"""
from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

from hyspec.conformance.controls import CONTROL_NAMES, control_matrix
from hyspec.conformance.methods import Workspace, methods_to_check


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--methods", nargs="*", default=None, help="default: every method")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--out", default=str(Path(__file__).with_name("matrix.json")))
    args = ap.parse_args()
    methods = args.methods or methods_to_check()
    ws = Workspace.create()
    started = time.time()
    try:
        rows = control_matrix(ws, methods, num_prompts=args.prompts, max_tokens=args.max_tokens)
    finally:
        ws.close()
    table = {m: {r["control"]: "yes" if r["identical"] else "NO" for r in rows if r["method"] == m} for m in methods}
    out = {"what": "greedy identity with sampling controls, method x control (tiny target, random drafters)",
           "machine": f"{platform.node()} ({platform.processor() or platform.machine()}), CPU, shared with other jobs",
           "prompts": args.prompts, "max_tokens": args.max_tokens, "controls": list(CONTROL_NAMES),
           "control_fields_note": {name: "see hyspec.conformance.controls.control_params" for name in CONTROL_NAMES},
           "all_identical": all(r["identical"] for r in rows), "seconds": round(time.time() - started, 1),
           "table": table, "rows": rows}
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    for m, cells in table.items():
        print(f"{m:22s} " + " ".join(f"{c}={v}" for c, v in cells.items()))
    print("all identical:", out["all_identical"])


if __name__ == "__main__":
    main()
