"""The conformance report: every check's outcome, as a table for people and JSON for machines.

JSON (schema 1)::

    {"schema_version": 1, "hyspec_version": "...", "quick": false, "passed": true,
     "backends": [
       {"name": "cpu", "mode": "native", "device": "cpu", "available": true, "reason": null,
        "ops": {"attention": {"source": "reference", "note": null, "status": "pass", "max_error": 0.0,
                              "tolerance": {"float32": {"atol": 1e-05, "rtol": 1e-05, "origin": "..."}, ...},
                              "cases": [{"label": "...", "dtype": "float32", "status": "pass",
                                         "max_error": 0.0, "ratio": 0.0, "atol": ..., "rtol": ..., "detail": ""}]},
                ...},
        "methods": {"ngram": {"status": "pass", "detail": "...", "cases": [...]}, ...},
        "checks": {"statistical": {...}, "onnx_drafter": {...}}}]}

``status`` is ``pass``, ``fail``, ``error`` (the check itself raised: a
failure with the exception as detail) or ``skip`` (with the reason as detail).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from hyspec import __version__

SCHEMA_VERSION = 1
STATUSES = ("pass", "fail", "error", "skip")


@dataclass
class CaseResult:
    label: str
    status: str
    dtype: str | None = None
    max_error: float | None = None
    ratio: float | None = None  # worst |error| / bound; <= 1 passes
    atol: float | None = None
    rtol: float | None = None
    origin: str | None = None  # which tolerance table the bound comes from
    detail: str = ""

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"CaseResult.status must be one of {STATUSES}, got {self.status!r}")

    def to_dict(self) -> dict[str, Any]:
        return {k: _finite(v) for k, v in self.__dict__.items()}


@dataclass
class CheckResult:
    """One op, method or whole-suite check on one backend, with its cases."""

    name: str
    status: str
    detail: str = ""
    source: str | None = None  # ops: the op table's source for this op
    note: str | None = None  # ops: why the op runs where it runs (e.g. which op falls back to the reference)
    cases: list[CaseResult] = field(default_factory=list)
    identity: dict[str, Any] | None = None  # methods: the teacher-forced comparison (hyspec.numerics.IdentityReport)

    @classmethod
    def from_cases(cls, name: str, cases: list[CaseResult], **kw: Any) -> "CheckResult":
        statuses = {c.status for c in cases}
        status = ("error" if "error" in statuses else "fail" if "fail" in statuses
                  else "pass" if "pass" in statuses else "skip")
        return cls(name=name, status=status, cases=cases, **kw)

    @property
    def max_error(self) -> float | None:
        errors = [c.max_error for c in self.cases if c.max_error is not None]
        return max(errors) if errors else None

    def tolerances(self) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        for c in self.cases:
            if c.dtype is not None and c.atol is not None:
                out.setdefault(c.dtype, {"atol": c.atol, "rtol": c.rtol, "origin": c.origin})
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"status": self.status, "detail": self.detail, "source": self.source, "note": self.note,
                "max_error": _finite(self.max_error), "tolerance": self.tolerances(),
                "cases": [c.to_dict() for c in self.cases],
                **({"identity": _finite_tree(self.identity)} if self.identity is not None else {})}


@dataclass
class BackendResult:
    name: str  # "cpu", "cuda", "npu"
    available: bool
    mode: str | None = None  # "native" or "triton-interpreter"
    device: str | None = None
    reason: str | None = None  # why it was not run
    ops: dict[str, CheckResult] = field(default_factory=dict)
    methods: dict[str, CheckResult] = field(default_factory=dict)
    checks: dict[str, CheckResult] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        results = [*self.ops.values(), *self.methods.values(), *self.checks.values()]
        return all(r.status in ("pass", "skip") for r in results)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "available": self.available, "mode": self.mode, "device": self.device,
                "reason": self.reason, "passed": self.passed,
                "ops": {k: v.to_dict() for k, v in self.ops.items()},
                "methods": {k: v.to_dict() for k, v in self.methods.items()},
                "checks": {k: v.to_dict() for k, v in self.checks.items()}}


@dataclass
class ConformanceReport:
    backends: list[BackendResult]
    quick: bool

    @property
    def passed(self) -> bool:
        return all(b.passed for b in self.backends)

    def to_dict(self) -> dict[str, Any]:
        return {"schema_version": SCHEMA_VERSION, "hyspec_version": __version__, "quick": self.quick,
                "passed": self.passed, "backends": [b.to_dict() for b in self.backends]}

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    def format(self, verbose: bool = False) -> str:
        lines = [f"hyspec {__version__} conformance ({'quick' if self.quick else 'full'})", ""]
        for b in self.backends:
            lines += _format_backend(b, verbose) + [""]
        failed = [b.name for b in self.backends if not b.passed]
        if not any(b.available for b in self.backends):
            lines.append("result: NOTHING CHECKED (no requested backend can run here)")
        else:
            lines.append("result: " + ("PASS" if not failed else f"FAIL ({', '.join(failed)})"))
        return "\n".join(lines)


def _format_backend(b: BackendResult, verbose: bool) -> list[str]:
    if not b.available:
        return [f"{b.name}: skipped -- {b.reason}"]
    lines = [f"{b.name} ({b.mode}, device {b.device})" + (f": {b.reason}" if b.reason else "")]
    lines.append(f"  {'op':<20}{'source':<11}{'status':<7}{'cases':>6}  {'max error':>10}  tolerance")
    for name, r in b.ops.items():
        passed = sum(c.status == "pass" for c in r.cases)
        tol = "; ".join(f"{d} {_tol(t)}" for d, t in r.tolerances().items()) or "exact"
        lines.append(f"  {name:<20}{r.source or '-':<11}{r.status:<7}{passed:>3}/{len(r.cases):<2}  "
                     f"{_num(r.max_error):>10}  {tol}")
        if r.note:
            lines.append(f"  {'':<20}note: {r.note}")
        lines += _failures(r, verbose)
    lines.append(f"  {'method / check':<20}{'status':<7}detail")
    for name, r in [*b.methods.items(), *b.checks.items()]:
        lines.append(f"  {name:<20}{r.status:<7}{r.detail}")
        lines += _failures(r, verbose)
    return lines


def _failures(r: CheckResult, verbose: bool) -> list[str]:
    shown = [c for c in r.cases if verbose or c.status in ("fail", "error")]
    return [f"      {c.status:<6}{(c.dtype or ''):<9}{c.label}: {_case_detail(c)}" for c in shown]


def _case_detail(c: CaseResult) -> str:
    if c.max_error is None:
        return c.detail
    bound = "exact" if c.atol == 0 and c.rtol == 0 else f"{_num(c.ratio)}x of the bound"
    return f"max error {_num(c.max_error)} ({bound})" + (f"; {c.detail}" if c.detail else "")


def _tol(t: dict[str, Any]) -> str:
    return "exact" if t["atol"] == 0 and t["rtol"] == 0 else f"{t['atol']:.2g}/{t['rtol']:.2g}"


def _num(x: float | None) -> str:
    if x is None:
        return "-"
    return "0" if x == 0 else f"{x:.2e}"


def _finite(v: Any) -> Any:
    """JSON has no inf/nan: they become strings."""
    if isinstance(v, float) and (v != v or v in (float("inf"), float("-inf"))):
        return str(v)
    return v


def _finite_tree(v: Any) -> Any:
    if isinstance(v, dict):
        return {k: _finite_tree(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_finite_tree(x) for x in v]
    return _finite(v)


__all__ = ["BackendResult", "CaseResult", "CheckResult", "ConformanceReport", "SCHEMA_VERSION"]
