"""First contact with an Ascend machine: everything the first person with a 910B needs to learn, in one JSON.

The Ascend twin of scripts/gpu_check.py.  Every step runs in a child process
with its own timeout and the report is rewritten after each step, so a hang or
a crash in one step (a kernel that faults the device) loses nothing before it:

1. ``npu-smi info``;
2. versions: torch, torch_npu, ``torch.version.cann``, ``torch_npu.npu.get_soc_version()``, the devices;
3. the op plan (hyspec.npu_ops.plan): each op's signature as installed, the ATB start-up call, the variant
   chosen per op and why the others were not;
4. ``hyspec probe --backend npu --json``;
5. the attention ladder (hyspec.npu_ops.first_contact): bf16, D = 128, GQA, block 128 first, then outwards,
   windowed steps last; then FIA's band mode (sparse_mode 4) against the reference window, to learn which
   ``pre_tokens`` reproduces it (``probe_band_mode``);
6. ``hyspec conformance --backend npu --quick`` (every op, every drafting method on a tiny target);
7. the same methods on the default model (SmolLM2-135M, D = 64: the BSND paths).

``--dry-run [BRANCH]`` runs it here against hyspec's emulated torch_npu of that op-plugin release
(default: the pinned one); it checks the script and the plumbing, not a kernel.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

from first_contact_steps import run_step  # scripts/first_contact_steps.py

REPO = Path(__file__).resolve().parents[1]
EMULATION = "from hyspec.npu_ops.emulation import install_from_env; install_from_env()\n"

VERSIONS = EMULATION + """
import json, torch, torch_npu
npu = torch_npu.npu
out = {"torch": torch.__version__, "torch_npu": torch_npu.__version__,
       "cann": getattr(torch.version, "cann", None), "emulated": getattr(torch_npu, "HYSPEC_EMULATION", None)}
try:
    out["soc_version"] = npu.get_soc_version()
except Exception as exc:
    out["soc_version_error"] = f"{type(exc).__name__}: {exc}"
out["devices"] = [npu.get_device_name(i) for i in range(npu.device_count())]
print(json.dumps(out))
"""
PLAN = EMULATION + "import json\nfrom hyspec.npu_ops import npu_op_plan\nprint(json.dumps(npu_op_plan()))\n"
LADDER = EMULATION + ("import json\nfrom hyspec.npu_ops.first_contact import run_ladder\n"
                      "print(json.dumps(run_ladder()))\n")
BAND = EMULATION + ("import json\nfrom hyspec.npu_ops.first_contact import probe_band_mode\n"
                    "print(json.dumps(probe_band_mode()))\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", nargs="?", const="pinned", default=None, metavar="BRANCH",
                        help="run against the emulated torch_npu of this op-plugin branch (default: the pinned one)")
    parser.add_argument("--out", type=Path, default=None, help="the JSON report (default: ./npu_first_contact.json)")
    parser.add_argument("--skip-default-model", action="store_true", help="leave out step 7")
    args = parser.parse_args()
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    if args.dry_run:
        from hyspec.npu_ops.op_schemas import PINNED_BRANCH

        env["HYSPEC_NPU_EMULATE"] = PINNED_BRANCH if args.dry_run == "pinned" else args.dry_run
    out_path = args.out or Path("npu_first_contact.json")
    hyspec = [sys.executable, "-m", "hyspec.cli.main"]
    report = {"started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "dry_run": env.get("HYSPEC_NPU_EMULATE"),
              "host": platform.node(), "python": platform.python_version(), "steps": []}
    steps = [
        ("npu-smi info", ["npu-smi", "info"], 60, False),
        ("versions", [sys.executable, "-c", VERSIONS], 300, True),
        ("op plan (signatures, ATB, variants)", [sys.executable, "-c", PLAN], 300, True),
        ("hyspec probe --backend npu", hyspec + ["probe", "--backend", "npu", "--json"], 300, True),
        ("attention ladder", [sys.executable, "-c", LADDER], 600, True),
        ("FIA band mode probe (sparse_mode 4 vs the window)", [sys.executable, "-c", BAND], 300, True),
        ("conformance (tiny target)", hyspec + ["conformance", "--backend", "npu", "--quick", "--json"], 900, True),
    ]
    if not args.skip_default_model:
        steps.append(("conformance methods (default model, D=64)", hyspec + [
            "conformance", "--backend", "npu", "--quick", "--model", "default", "--only", "methods", "--json"],
            1200, True))
    failed = 0
    for name, cmd, timeout_s, parse in steps:
        print(f"... {name}", flush=True)
        step = run_step(name, cmd, timeout_s, env, REPO, expect_json=parse)
        report["steps"].append(step)
        failed += step.get("returncode") not in (0, None) or bool(step.get("timed_out"))
        out_path.write_text(json.dumps(report, indent=1) + "\n")  # after every step: nothing is lost to a hang
    report["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    ladder = next((s.get("result") for s in report["steps"] if s["step"] == "attention ladder"), None) or []
    report["summary"] = {"steps_failed": failed,
                         "ladder": {r["rung"]: ("pass" if r.get("passed") else f"FAIL: {r.get('error')}")
                                    + f" [{r.get('route')}]" for r in ladder}}
    out_path.write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report["summary"], indent=1))
    print(f"report: {out_path}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
