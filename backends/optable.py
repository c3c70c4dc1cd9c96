"""A backend's op table: the pure-torch references, overridden by the backend's own ops.

Each op package (``hyspec.cuda_ops``, ``hyspec.npu_ops``, ``hyspec.cpu_ops``)
may expose ``<kind>_op_overrides() -> dict[str, Callable]``.  It is called
lazily, when a backend is built, never at import.  When the package or the
function is missing, or calling it fails, the backend runs on the reference
ops and the reason is logged and kept (the probe reports it as ``ops_note``).
"""
from __future__ import annotations

import importlib
import logging
from dataclasses import dataclass
from typing import Callable

from hyspec.ops import OP_NAMES, OpTable, reference_ops

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ResolvedOps:
    table: OpTable
    note: str | None  # why (some of) the backend's own ops are not in use; None when nothing went wrong


def resolve_ops(module_name: str, function_name: str, source: str) -> ResolvedOps:
    """``reference_ops()`` overridden by ``module_name.function_name()``, labelled ``source``."""
    table = reference_ops()
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        return _fallback(table, f"{module_name} cannot be imported ({exc}); using the reference ops")
    provider: Callable[[], dict[str, Callable]] | None = getattr(module, function_name, None)
    if provider is None:
        # the op package exists but has no overrides yet: a normal state, not a failure
        return ResolvedOps(table=table, note=f"{module_name} has no {function_name}(); using the reference ops")
    try:
        overrides = provider()
    except Exception as exc:  # a broken kernel module must not take the backend down
        return _fallback(table, f"{module_name}.{function_name}() failed: {type(exc).__name__}: {exc}; "
                                "using the reference ops")
    if not isinstance(overrides, dict):
        return _fallback(table, f"{module_name}.{function_name}() returned {type(overrides).__name__}, "
                                "not a dict of op name -> callable; using the reference ops")
    unknown = sorted(set(overrides) - set(OP_NAMES))
    not_callable = sorted(name for name, fn in overrides.items() if name in OP_NAMES and not callable(fn))
    usable = {name: fn for name, fn in overrides.items() if name in OP_NAMES and callable(fn)}
    problems = []
    if unknown:
        problems.append(f"unknown op name(s) {unknown} (ops are {list(OP_NAMES)})")
    if not_callable:
        problems.append(f"non-callable override(s) {not_callable}")
    note = None
    if problems:
        note = f"{module_name}.{function_name}(): ignored " + "; ".join(problems)
        log.warning(note)
    return ResolvedOps(table=table.with_overrides(source, **usable) if usable else table, note=note)


def _fallback(table: OpTable, note: str) -> ResolvedOps:
    log.warning(note)
    return ResolvedOps(table=table, note=note)
