"""scripts/gpu_check.py keeps working: its --dry-run (CPU, interpreter, tiny sizes) and argument handling."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "gpu_check.py"


#: Runs the script as a GPU machine would: torch and triton installed, hyspec not (its editable finder dropped).
WITHOUT_INSTALL = """
import runpy, sys
sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in getattr(f, "__module__", "")]
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    environment = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "OUT")}
    environment.update(env or {})
    return subprocess.run([sys.executable, "-c", WITHOUT_INSTALL, str(SCRIPT), *args], capture_output=True,
                          text=True, env=environment, timeout=300, cwd="/")


def test_dry_run_checks_every_op_and_writes_json_to_out(tmp_path: Path) -> None:
    result = run("--dry-run", "--reps", "1", "--warmup", "0", env={"OUT": str(tmp_path)})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert report["dry_run"] and not report["errors"]
    assert {r["op"] for r in report["correctness"]} == {"attention", "write_kv", "compact_kv", "rms_norm",
                                                         "rotary", "rejection_sample"}
    assert all(r["passed"] for r in report["correctness"])
    assert report["consistency"]["bitwise_equal"]
    timed = [r for r in report["timing"] if "skipped" not in r]
    assert timed and all(r["kernel_ms"] > 0 for r in timed)


@pytest.mark.skipif(
    subprocess.run([sys.executable, "-c", "import torch, sys; sys.exit(torch.cuda.is_available())"]).returncode,
    reason="a CUDA device is present: the script would run for real")
def test_without_cuda_it_says_so() -> None:
    result = run()
    assert result.returncode == 2 and "--dry-run" in result.stderr


def test_rejects_bad_arguments() -> None:
    result = run("--dry-run", "--reps", "0")
    assert result.returncode == 2 and "--reps" in result.stderr
