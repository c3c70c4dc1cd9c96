"""torch_npu signatures: read from the installed torch_npu (or from op-plugin data) and checked before a call.

An op that exists by name can still reject hyspec's call: op-plugin 7.1.0's
``npu_apply_rotary_pos_emb(query, key, cos, sin, layout='BSH')`` has no
``rotary_mode``, and ``npu_scatter_pa_kv_cache`` gained ``cache_mode`` only in
26.0.0.  So every op is used only when its signature takes the keywords
hyspec passes.  Signatures come from, in order:

1. the op's ``FunctionSchema`` (``OpOverload._schema``, ``packet.default._schema``,
   or torch's operator registry ``npu::<name>`` / ``atb::<name>``): what the
   dispatcher itself will enforce;
2. ``inspect.signature`` of a Python wrapper;
3. nothing: the op is not used (a call we cannot check is a call we do not make).

``op_plugin_data/<branch>.json`` holds the signatures and documented limits of
op-plugin release branches, extracted from the sources by
``scripts/extract_npu_op_data.py`` (the commit is in each file); the emulated
torch_npu is built from them, and the live limits of an installed torch_npu
are those of its branch.
"""
from __future__ import annotations

import functools
import inspect
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

DATA_DIR = Path(__file__).parent / "op_plugin_data"
#: the op-plugin branch of the supported stack (docs/npu.md): CANN 9.1.0, torch-npu 2.10.0.post4, torch 2.10.0
PINNED_BRANCH = "26.1.0"


@dataclass(frozen=True)
class Signature:
    """What a call may pass: positional parameters in order, keyword-only ones, and which are required."""

    name: str
    positional: tuple[str, ...]
    keyword_only: tuple[str, ...]
    required: frozenset[str]
    text: str  # the schema (or Python signature) it was read from

    @property
    def parameters(self) -> tuple[str, ...]:
        return self.positional + self.keyword_only

    def accepts(self, *keywords: str) -> bool:
        return all(k in self.parameters for k in keywords)

    def missing(self, *keywords: str) -> list[str]:
        return [k for k in keywords if k not in self.parameters]

    def bind(self, args: tuple, kwargs: dict[str, Any]) -> dict[str, Any]:
        """Match a call to this signature as torch's Python argument parser does (TypeError on a mismatch)."""
        if len(args) > len(self.positional):
            raise TypeError(f"{self.name}() takes {len(self.positional)} positional arguments but {len(args)} "
                            "were given")
        bound = dict(zip(self.positional, args))
        for key, value in kwargs.items():
            if key not in self.parameters:
                raise TypeError(f"{self.name}() got an unexpected keyword argument '{key}'")
            if key in bound:
                raise TypeError(f"{self.name}() got multiple values for argument '{key}'")
            bound[key] = value
        absent = [p for p in self.parameters if p in self.required and p not in bound]
        if absent:
            raise TypeError(f"{self.name}() missing required argument '{absent[0]}'")
        return bound

    @classmethod
    def from_schema(cls, schema: Any) -> "Signature":
        """From a ``torch._C.FunctionSchema`` or its text."""
        if isinstance(schema, str):
            import torch

            schema = torch._C.parse_schema(schema)
        positional = tuple(a.name for a in schema.arguments if not a.kwarg_only)
        keyword_only = tuple(a.name for a in schema.arguments if a.kwarg_only)
        required = frozenset(a.name for a in schema.arguments if not a.has_default_value())
        return cls(schema.name.split("::")[-1], positional, keyword_only, required, str(schema))

    @classmethod
    def from_callable(cls, fn: Callable, name: str) -> "Signature | None":
        try:
            sig = inspect.signature(fn)
        except (TypeError, ValueError):  # builtins (pybind11 / C bindings) carry no Python signature
            return None
        kinds = inspect.Parameter
        if any(p.kind in (kinds.VAR_POSITIONAL, kinds.VAR_KEYWORD) for p in sig.parameters.values()):
            return None  # *args/**kwargs say nothing about what the op takes
        positional = tuple(p.name for p in sig.parameters.values() if p.kind != kinds.KEYWORD_ONLY)
        keyword_only = tuple(p.name for p in sig.parameters.values() if p.kind == kinds.KEYWORD_ONLY)
        required = frozenset(p.name for p in sig.parameters.values() if p.default is kinds.empty)
        return cls(name, positional, keyword_only, required, f"{name}{sig}")


def signature_of(fn: Callable, namespace: str, name: str) -> Signature | None:
    """The signature the installed ``fn`` enforces, or None when none can be read (see the module doc)."""
    schema = getattr(fn, "_schema", None)
    if schema is None:
        schema = getattr(getattr(fn, "default", None), "_schema", None)
    if schema is None:
        try:
            import torch

            schemas = torch._C._jit_get_schemas_for_operator(f"{namespace}::{name}")
        except Exception:  # an unknown namespace or a torch without the registry lookup
            schemas = []
        plain = [s for s in schemas if s.overload_name == ""]
        schema = (plain or schemas or [None])[0]
    if schema is not None:
        return Signature.from_schema(schema)
    return Signature.from_callable(fn, name)


@dataclass(frozen=True)
class OpPluginRelease:
    """One op-plugin release branch: its signatures and documented limits (op_plugin_data/<branch>.json)."""

    branch: str
    commit: str
    torch_npu: tuple[str, ...]
    torch: tuple[str, ...]
    cann: str
    functions: dict[str, str]  # name -> schema text
    constraints: dict[str, dict] = field(default_factory=dict)

    def signature(self, name: str) -> Signature | None:
        text = self.functions.get(name)
        return Signature.from_schema(text) if text else None

    def limits(self, name: str) -> dict:
        return self.constraints.get(name, {})

    def describe(self) -> str:
        return f"op-plugin {self.branch} @ {self.commit[:10]} (torch-npu {'/'.join(self.torch_npu)}, CANN {self.cann})"


def branches() -> list[str]:
    """The op-plugin branches with data here, oldest first."""
    return sorted((p.stem for p in DATA_DIR.glob("*.json")), key=_version_key)


@functools.lru_cache(maxsize=None)
def load_release(branch: str) -> OpPluginRelease:
    path = DATA_DIR / f"{branch}.json"
    if not path.is_file():
        raise ValueError(f"no op-plugin data for branch {branch!r}; have {', '.join(branches())}")
    data = json.loads(path.read_text())
    return OpPluginRelease(branch=data["op_plugin_branch"], commit=data["commit"],
                           torch_npu=tuple(data.get("torch_npu", ())), torch=tuple(data.get("torch", ())),
                           cann=data.get("cann", "?"), functions=data["functions"],
                           constraints=data.get("constraints", {}))


def release_for_torch_npu(version: str | None) -> OpPluginRelease | None:
    """The branch whose releases include this torch_npu version (matched on major.minor.patch), else None."""
    if not version:
        return None
    want = _release(version)
    for branch in branches():
        release = load_release(branch)
        if any(_release(v) == want for v in release.torch_npu):
            return release
    return None


def _release(version: str) -> tuple[int, ...]:
    match = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", version)
    return tuple(int(g or 0) for g in match.groups()) if match else ()


def _version_key(branch: str) -> tuple[int, ...]:
    return _release(branch)


__all__ = ["PINNED_BRANCH", "OpPluginRelease", "Signature", "branches", "load_release", "release_for_torch_npu",
           "signature_of"]
