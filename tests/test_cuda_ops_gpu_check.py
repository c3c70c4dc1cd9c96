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


#: Runs the script as a GPU machine would: torch and triton installed, hyspec not (its editable finder dropped), the
#: file run by path as `python scripts/gpu_check.py` runs it -- what the script's own fallback import must survive.
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


def test_a_sticky_cuda_error_skips_the_rest_and_keeps_what_was_measured(tmp_path: Path) -> None:
    """After an illegal address every CUDA call raises, empty_cache() too: the run records it, skips the
    remaining cases, and the JSON on disk holds every result before it (scripts/gpu_check.py, guarded)."""
    import types

    from scripts import gpu_check as module  # the repository root is on sys.path under pytest (tests/ is a package)

    class FakeCuda:
        broken = False

        def get_device_name(self, device):
            return "NVIDIA H200"

        def empty_cache(self):
            if self.broken:
                raise RuntimeError("CUDA error: an illegal memory access was encountered")

        def synchronize(self):
            self.empty_cache()

    fake_torch = types.SimpleNamespace(cuda=FakeCuda(), empty=lambda *a, **k: None, uint8=None)
    args = module.parse_args(["--out", str(tmp_path / "report.json")])
    chk = module.Checker(args, fake_torch, types.SimpleNamespace(type="cuda"))
    chk.guarded("rms_norm", "ok", lambda: chk.correctness.append(dict(op="rms_norm", case="ok", passed=True)))

    def fault() -> None:
        fake_torch.cuda.broken = True
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    chk.guarded("rejection_sample", "faults", fault)
    chk.guarded("attention", "after", lambda: chk.correctness.append(dict(op="attention", passed=True)))
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["correctness"] == [dict(op="rms_norm", case="ok", passed=True)]
    assert "rejection_sample faults" in report["context_lost"]
    assert report["errors"][-1]["skipped"].startswith("CUDA context lost earlier")


@pytest.mark.slow
def test_gpu_first_contact_dry_run_passes_and_reports_every_step(tmp_path: Path) -> None:
    out = tmp_path / "first_contact.json"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run(["bash", str(SCRIPT.parent / "gpu_first_contact.sh"), "--dry-run", "--out", str(out)],
                       capture_output=True, text=True, timeout=600, env=dict(env, PYTHON=sys.executable))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    report = json.loads(out.read_text())
    steps = {s["step"]: s for s in report["steps"]}
    assert report["steps_failed"] == 0
    assert steps["rejection sampler race cases"]["result"]["passed"] is True
    assert steps["ops at small sizes (conformance --only ops)"]["result"]["passed"] is True
    assert json.loads((tmp_path / "first_contact_gpu_check.json").read_text())["dry_run"] is True
    assert "skipped" in steps["graph capture of a decode step"]
    assert "dry run" in steps["end to end: hyspec bench on the default model"]["skipped"]
