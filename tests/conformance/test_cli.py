"""``hyspec conformance`` as an operator runs it: JSON listing every op and method, exit codes, forced backends."""
from __future__ import annotations

import json
import subprocess
import sys

from hyspec.conformance.methods import methods_to_check
from hyspec.conformance.report import BackendResult, CaseResult, CheckResult, ConformanceReport
from hyspec.ops import OP_NAMES


def hyspec(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hyspec.cli.main", "conformance", *args], capture_output=True,
                          text=True, timeout=600)


def test_json_lists_every_op_with_its_tolerance():
    r = hyspec("--backend", "cpu", "--quick", "--only", "ops", "--json")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["schema_version"] == 1 and report["passed"] is True
    cpu = report["backends"][0]
    assert cpu["name"] == "cpu" and cpu["available"]
    assert set(cpu["ops"]) == set(OP_NAMES)
    for op, result in cpu["ops"].items():
        assert result["status"] == "pass", (op, result)
        assert result["tolerance"], op  # per dtype: atol, rtol and the table they come from
        assert all({"atol", "rtol", "origin"} <= set(t) for t in result["tolerance"].values())


def test_forcing_a_backend_that_cannot_run_exits_2_with_the_reason():
    r = hyspec("--backend", "npu", "--only", "ops")
    assert r.returncode == 2
    assert "npu: skipped" in r.stdout and "torch_npu" in r.stderr


def test_report_rows_cover_methods_and_failures_are_shown():
    """The table and JSON name every method; a failing case is printed with its error and bound."""
    bad = CaseResult(label="decode gqa2", status="fail", dtype="bfloat16", max_error=0.5, ratio=12.0, atol=0.0078,
                     rtol=0.0156, origin="hyspec.cuda_ops.tolerances")
    ops = {"attention": CheckResult.from_cases("attention", [bad], source="triton")}
    methods = {m: CheckResult(m, "skip", detail="not in this build") for m in methods_to_check()}
    report = ConformanceReport([BackendResult("cuda", True, "native", "cuda:0", ops=ops, methods=methods),
                                BackendResult("npu", False, reason="no NPU")], quick=True)
    text = report.format()
    assert "decode gqa2: max error 5.00e-01 (1.20e+01x of the bound)" in text
    assert "FAIL (cuda)" in text and "npu: skipped -- no NPU" in text
    data = json.loads(report.to_json())
    assert data["passed"] is False
    assert set(data["backends"][0]["methods"]) == set(methods_to_check())
    assert data["backends"][0]["ops"]["attention"]["tolerance"]["bfloat16"]["atol"] == 0.0078


def test_a_missing_model_is_one_clear_error_before_anything_runs(tmp_path):
    missing = tmp_path / "no-such-model"
    r = hyspec("--backend", "cpu", "--only", "methods", "--model", str(missing))
    assert r.returncode == 2 and r.stdout == ""
    assert "hyspec conformance: error:" in r.stderr and str(missing) in r.stderr


def test_methods_report_teacher_forced_identity_in_json():
    r = hyspec("--backend", "cpu", "--quick", "--only", "methods", "--json")
    assert r.returncode == 0, r.stderr
    methods = json.loads(r.stdout)["backends"][0]["methods"]
    rule = methods["plain"]["identity"]["rule"]
    assert rule["positions"] > 0 and 0 <= rule["bound"] <= 4 * rule["measured"] + 1e-12
    for name in ("ngram", "draft_model (self)"):
        identity = methods[name]["identity"]
        assert identity["positions"] > 0 and identity["mismatches"] == 0 and identity["drafted"] > 0, name
        assert "positions compared" in methods[name]["detail"]
