"""Which torch_npu functions this process has, found at call time (never at import).

torch_npu exposes its fused ops as ``torch_npu.<name>``; the same ops are
registered with torch as ``torch.ops.npu.<name>`` (aclnn ops from op-plugin)
or ``torch.ops.atb.<name>`` (ATB ops: the ``_npu_*`` wrappers).  Older or
trimmed builds lack some of them, so every function is looked up on its own
and an op whose functions are all missing falls back to the reference.
Whether a function found here is used is decided by hyspec.npu_ops.plan
(its signature, the documented limits, ATB's state).
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from types import ModuleType
from typing import Callable

import torch

#: field -> (torch_npu attribute, torch.ops namespace that also registers it)
FUNCTIONS: dict[str, tuple[str, str]] = {
    "fia": ("npu_fused_infer_attention_score", "npu"),
    "paged_attention": ("_npu_paged_attention", "atb"),
    "scatter_pa_kv_cache": ("npu_scatter_pa_kv_cache", "npu"),
    "reshape_and_cache": ("_npu_reshape_and_cache", "atb"),
    "rms_norm": ("npu_rms_norm", "npu"),
    "add_rms_norm": ("npu_add_rms_norm", "npu"),
    "apply_rotary_pos_emb": ("npu_apply_rotary_pos_emb", "npu"),
    "rotary_mul": ("npu_rotary_mul", "npu"),
    "rotary_embedding": ("_npu_rotary_embedding", "atb"),
}


@dataclass(frozen=True)
class NpuFunctions:
    """The torch_npu functions found (None = absent) and where each came from."""

    fia: Callable | None = None
    paged_attention: Callable | None = None
    scatter_pa_kv_cache: Callable | None = None
    reshape_and_cache: Callable | None = None
    rms_norm: Callable | None = None
    add_rms_norm: Callable | None = None
    apply_rotary_pos_emb: Callable | None = None
    rotary_mul: Callable | None = None
    rotary_embedding: Callable | None = None
    origin: dict[str, str] = field(default_factory=dict)  # field -> "torch_npu.X" / "torch.ops.npu.X"

    def name(self, which: str) -> str:
        """Where ``which`` came from, or the names it was looked for under."""
        if which in self.origin:
            return self.origin[which]
        attr, namespace = FUNCTIONS[which]
        return f"torch_npu.{attr} / torch.ops.{namespace}.{attr}"


def _lookup(torch_npu: ModuleType, attr: str, namespace: str) -> tuple[Callable | None, str | None]:
    fn = getattr(torch_npu, attr, None)
    if callable(fn):
        return fn, f"torch_npu.{attr}"
    try:  # torch.ops namespaces resolve lazily and raise (AttributeError/RuntimeError) for unknown ops
        fn = getattr(getattr(torch.ops, namespace), attr)
    except Exception:
        return None, None
    return fn, f"torch.ops.{namespace}.{attr}"


def find_functions(torch_npu: ModuleType) -> NpuFunctions:
    found: dict[str, Callable] = {}
    origin: dict[str, str] = {}
    for which, (attr, namespace) in FUNCTIONS.items():
        fn, where = _lookup(torch_npu, attr, namespace)
        if fn is not None:
            found[which], origin[which] = fn, where
    return NpuFunctions(**found, origin=origin)


def import_torch_npu() -> ModuleType:
    """``import torch_npu`` (raises ImportError with torch_npu's own message when it cannot be imported)."""
    try:
        return importlib.import_module("torch_npu")
    except ImportError:
        raise
    except Exception as exc:  # a broken CANN install can fail with OSError/RuntimeError inside the import
        raise ImportError(f"import torch_npu failed: {type(exc).__name__}: {exc}") from exc
