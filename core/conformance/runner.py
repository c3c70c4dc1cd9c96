"""Run the whole suite on the requested backends and collect one report."""
from __future__ import annotations

import logging
import time
from typing import Callable

from hyspec.assets import default_model
from hyspec.conformance.methods import Workspace, check_methods
from hyspec.conformance.op_checks import check_ops
from hyspec.conformance.report import BackendResult, CaseResult, CheckResult, ConformanceReport
from hyspec.conformance.stats import check_statistics
from hyspec.conformance.targets import Target, Unavailable, resolve
from hyspec.conformance.tiny import prompts
from hyspec.cpu_ops.onnx_check import check_against_torch
from hyspec.cpu_ops.onnx_drafter import OnnxDraftModel, export_draft_model
from hyspec.cpu_ops.onnx_runtime import OnnxUnavailableError
from hyspec.model.config import ModelConfig
from hyspec.model.loader import load_model

log = logging.getLogger(__name__)

#: the parts of the suite, in the order they run
PARTS = ("ops", "methods", "statistical", "onnx_drafter")


def run_conformance(backend: str = "all", quick: bool = False, parts: tuple[str, ...] = PARTS,
                    progress: Callable[[str], None] | None = None, model: str | None = None,
                    dtype: str | None = None) -> ConformanceReport:
    """Check every requested backend that can run here; unavailable ones are reported with the reason.

    ``model``: the target the drafting methods run on (a checkpoint directory or .gguf file, or
    ``"default"`` for hyspec's default model); None: the tiny target written for the run.  ``dtype``:
    the methods' engines run in it (None: fp32 on the CPU, bf16 on accelerators).
    """
    unknown = set(parts) - set(PARTS)
    if unknown:
        raise ValueError(f"unknown conformance parts {sorted(unknown)}; parts are {PARTS}")
    say = progress or (lambda message: log.info(message))
    results: list[BackendResult] = []
    ws: Workspace | None = None
    model = _model_path(model)
    try:
        for target in resolve(backend):
            if isinstance(target, Unavailable):
                results.append(BackendResult(target.name, available=False, reason=target.reason))
                continue
            if ws is None and "methods" in parts:
                ws = Workspace.create(model, dtype)
            results.append(check_target(target, quick, parts, ws, say))
    finally:
        if ws is not None:
            ws.close()
    return ConformanceReport(results, quick)


def _model_path(model: str | None) -> str | None:
    """The --model target, checked before any backend runs (a bad path is one clear error, not one per method)."""
    if model is None:
        return None
    if model == "default":
        return str(default_model())
    ModelConfig.from_pretrained(model)  # CheckpointError naming the missing directory, file or config
    return model


def check_target(target: Target, quick: bool, parts: tuple[str, ...], ws: Workspace | None,
                 say: Callable[[str], None]) -> BackendResult:
    result = BackendResult(target.name, available=True, mode=target.mode, device=str(target.device),
                           reason=target.note)
    started = time.perf_counter()
    if "ops" in parts:
        say(f"{target.name}: ops")
        result.ops = check_ops(target, quick)
    if "methods" in parts and ws is not None:
        say(f"{target.name}: drafting methods")
        result.methods = check_methods(target, ws, quick)
    if "statistical" in parts:
        say(f"{target.name}: statistical test")
        result.checks["statistical"] = check_statistics(target)
    if "onnx_drafter" in parts and target.name == "cpu":
        say(f"{target.name}: ONNX Runtime drafter")
        result.checks["onnx_drafter"] = check_onnx_drafter(ws)
    log.info("%s checked in %.1fs", target.name, time.perf_counter() - started)
    return result


def check_onnx_drafter(ws: Workspace | None) -> CheckResult:
    """The exported draft_model drafter in ONNX Runtime against the torch drafter (hyspec.cpu_ops.onnx_check)."""
    try:
        owned = ws is None
        ws = ws or Workspace.create()
        try:
            drafter_dir = ws.drafter("draft_model")
            onnx = OnnxDraftModel(export_draft_model(drafter_dir), num_threads=1)
            check = check_against_torch(load_model(drafter_dir, dtype="float32"), onnx, prompts(3), steps=6)
        finally:
            if owned:
                ws.close()
    except OnnxUnavailableError as exc:
        return CheckResult("onnx_drafter", "skip", detail=str(exc))
    except Exception as exc:
        return CheckResult("onnx_drafter", "error", detail=f"{type(exc).__name__}: {exc}")
    case = CaseResult(label="prefill, 6 greedy steps, one roll-back; 3 ragged rows", dtype="float32",
                      status="pass" if check.passed else "fail", max_error=check.max_abs_error,
                      ratio=check.worst_ratio, atol=check.atol, rtol=check.rtol, origin="hyspec.cpu_ops.onnx_check")
    result = CheckResult.from_cases("onnx_drafter", [case], source="onnxruntime")
    result.detail = (f"logits vs the torch drafter: max error {check.max_abs_error:.2e} over {check.compared_rows} "
                     f"rows (tolerance atol {check.atol:g}, rtol {check.rtol:g})")
    return result


__all__ = ["PARTS", "check_onnx_drafter", "check_target", "run_conformance"]
