"""hyspec.conformance: one suite that holds every backend to the reference ops and to plain decoding.

For each backend that can run here (``targets``): every op of its op table
against the pure-torch reference within the one tolerance table
(``tolerances``) over ragged batches, trees, page boundaries and GQA ratios
(``op_cases``, ``op_checks``); greedy identity of every drafting method the
build has, with the KV pool checked clean after each run (``methods``); the
statistical test at temperature > 0 (``stats``); on the CPU, the ONNX
Runtime drafter against the torch drafter.  ``run_conformance`` returns a
``ConformanceReport`` (``report``); ``hyspec conformance`` prints it, and
tests/conformance runs the same checks under pytest.

    from hyspec.conformance import run_conformance
    report = run_conformance("cpu", quick=True)
    print(report.format()); report.passed

Importing this package imports torch (the checks are tensor code) but no
vendor package: triton, torch_npu and onnxruntime load when a check needs them.
"""
from __future__ import annotations

from hyspec.conformance.report import BackendResult, CaseResult, CheckResult, ConformanceReport
from hyspec.conformance.runner import PARTS, run_conformance

__all__ = ["BackendResult", "CaseResult", "CheckResult", "ConformanceReport", "PARTS", "run_conformance"]
