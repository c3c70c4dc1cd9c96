"""Each op of a backend's table against the reference op, case by case, within the tolerance table."""
from __future__ import annotations

import traceback

import torch

from hyspec.conformance.op_cases import OpCase, op_cases
from hyspec.conformance.report import CaseResult, CheckResult
from hyspec.conformance.targets import Target
from hyspec.conformance.tolerances import TOKEN_OPS, bound
from hyspec.errors import HyspecError
from hyspec.ops import OP_NAMES, reference_ops

CPU = torch.device("cpu")


def check_op(target: Target, op: str, quick: bool) -> CheckResult:
    """Every case of ``op``: the target's version on its device vs the reference on the CPU."""
    if op not in OP_NAMES:
        raise KeyError(f"unknown op {op!r}; ops are {OP_NAMES}")
    source = target.source(op)
    cases = [run_case(case, target, source) for case in op_cases(op, quick)]
    return CheckResult.from_cases(op, cases, source=source, note=target.op_notes.get(op))


def run_case(case: OpCase, target: Target, source: str) -> CaseResult:
    dtype = str(case.dtype).removeprefix("torch.")
    tol = bound(case.op, case.dtype, source)
    common = dict(label=case.label, dtype=dtype, atol=tol.atol, rtol=tol.rtol, origin=tol.origin)
    reference = getattr(reference_ops(), case.op)
    args = case.make(CPU)
    expected = case.outcome(reference(*args), args)
    try:
        args = case.make(target.device)
        actual = case.outcome(getattr(target.ops, case.op)(*args), args)
        if target.device.type != "cpu":
            target.backend.synchronize()
    except HyspecError as exc:  # refused before launch, naming the limit (e.g. FIA takes no fp32): not served here
        return CaseResult(status="skip", detail=f"not served by this backend: {exc}", **common)
    except Exception as exc:  # a kernel that raises fails its case; the report shows why
        detail = f"{type(exc).__name__}: {exc}".splitlines()[0]
        return CaseResult(status="error", detail=detail + _where(exc), **common)
    if len(actual) != len(expected):
        return CaseResult(status="fail", detail=f"returned {len(actual)} tensors, the reference {len(expected)}",
                          **common)
    worst_error, worst_ratio, problems = 0.0, 0.0, []
    for i, (a, e) in enumerate(zip(actual, expected)):
        if tuple(a.shape) != tuple(e.shape) or a.dtype != e.dtype:
            problems.append(f"output {i}: {a.dtype} {tuple(a.shape)} vs reference {e.dtype} {tuple(e.shape)}")
            continue
        if case.op in TOKEN_OPS:
            mismatched = int((a.cpu() != e.cpu()).sum())
            worst_error = max(worst_error, float(mismatched))
            worst_ratio = max(worst_ratio, float("inf") if mismatched else 0.0)
            if mismatched:
                problems.append(f"output {i}: {mismatched} of {e.numel()} ids differ")
            continue
        error, ratio = tol.measure(a, e)
        worst_error, worst_ratio = max(worst_error, error), max(worst_ratio, ratio)
    status = "pass" if not problems and worst_ratio <= 1.0 else "fail"
    return CaseResult(status=status, max_error=worst_error, ratio=worst_ratio, detail="; ".join(problems), **common)


def _where(exc: Exception) -> str:
    frames = traceback.extract_tb(exc.__traceback__)
    return f" (at {frames[-1].filename.rsplit('/', 1)[-1]}:{frames[-1].lineno})" if frames else ""


def check_ops(target: Target, quick: bool) -> dict[str, CheckResult]:
    return {op: check_op(target, op, quick) for op in OP_NAMES}


__all__ = ["check_op", "check_ops", "run_case"]
