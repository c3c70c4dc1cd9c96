"""Which backends the suite can check here, and the op table and device of each.

* ``cpu``: the CPU backend's op table (reference ops plus hyspec.cpu_ops'
  overrides, if any) on the host.
* ``cuda``: with a CUDA device, the CUDA backend's table (Triton kernels) on
  ``cuda:0``.  Without one but with triton installed, the same Triton kernels
  under ``TRITON_INTERPRET=1`` on CPU tensors (mode ``triton-interpreter``,
  over the CPU backend's table): correctness only, numpy-slow.  The variable must be set before the kernel
  modules are imported, so it is set here, for this process, when they are not
  imported yet; if they were imported compiled, the target is reported as
  unavailable with the fix.
* ``npu``: the NPU backend's table (torch_npu fused ops, per-op fallback to
  the reference) on ``npu:0``; never available without an Ascend device.

For every op the target records its source and, where the backend falls back
to the reference, why (``hyspec.npu_ops.npu_op_report`` / the backend's
``ops_note``): the forced-backend-with-missing-ops case of the issue.
"""
from __future__ import annotations

import contextlib
import importlib.util
import os
import sys
from dataclasses import dataclass, field
from typing import Any, Iterator

import torch

from hyspec.backend import Backend
from hyspec.backends import registry
from hyspec.backends.cpu import CPUBackend
from hyspec.backends.probe import probe, probe_cpu
from hyspec.backends.registry import backend_for
from hyspec.errors import ConfigError
from hyspec.graph_capture import ReexecutingCapturer
from hyspec.npu_ops import npu_op_report
from hyspec.ops import OP_NAMES, OpTable

NAMES = ("cpu", "cuda", "npu")
NATIVE, INTERPRETER = "native", "triton-interpreter"


@dataclass
class Target:
    name: str
    mode: str
    device: torch.device
    backend: Backend  # the engine runs on it (for the interpreter: a CPU backend carrying the Triton table)
    op_notes: dict[str, str] = field(default_factory=dict)  # op -> what serves it / why it falls back
    note: str | None = None

    @property
    def ops(self) -> OpTable:
        return self.backend.ops

    def source(self, op: str) -> str:
        return self.ops.sources[op]

    @property
    def engine_backend_name(self) -> str | None:
        """The ``backend=`` name to build an LLM with, or None when the backend must be injected."""
        return self.name if self.mode == NATIVE else None


@dataclass
class Unavailable:
    name: str
    reason: str


def resolve(requested: str) -> list[Target | Unavailable]:
    """The targets for ``requested`` ("cpu", "cuda", "npu" or "all")."""
    if requested not in (*NAMES, "all"):
        raise ConfigError("backend", f"{requested!r} is not a conformance target; choose cpu, cuda, npu or all")
    report = probe(backend="auto")  # records of every backend, whatever HYSPEC_BACKEND says
    names = NAMES if requested == "all" else (requested,)
    return [_resolve_one(name, report.backend(name)) for name in names]


def _resolve_one(name: str, record: Any) -> Target | Unavailable:
    caps = record.capabilities
    if name == "cuda" and not record.available:
        return _triton_interpreter(caps.reason)
    if not record.available:
        return Unavailable(name, caps.reason + (f"; to get it: {caps.hint}" if caps.hint else ""))
    backend = backend_for(name, caps)
    notes = op_notes(name, backend)
    return Target(name, NATIVE, backend.device, backend, notes, getattr(backend, "ops_note", None))


def op_notes(name: str, backend: Backend) -> dict[str, str]:
    """Per op, what serves it on the NPU (and which op falls back, and why); other backends say it in ops_note."""
    if name != "npu":
        return {}
    report = npu_op_report()
    return {op: report[op] for op in OP_NAMES if op in report}


def _triton_interpreter(cuda_reason: str) -> Target | Unavailable:
    if importlib.util.find_spec("triton") is None:
        return Unavailable("cuda", f"{cuda_reason}; triton is not installed either, so the kernels cannot run "
                                   "under its interpreter (pip install 'hyspec[cuda]')")
    if "triton" not in sys.modules:
        # triton.language's own @jit helpers are decorated when triton is imported: set it before (module doc)
        os.environ["TRITON_INTERPRET"] = "1"
    # hyspec.cuda_ops brings the optional triton (hyspec[cuda]): imported here, after TRITON_INTERPRET is set
    from hyspec.cuda_ops import cuda_op_overrides

    # The engine runs on a CPU backend here: its table (the packed ``logits`` of hyspec.cpu_ops) with the
    # Triton kernels on top, as its optimize_model packs the linear layers.
    backend = CPUBackend(probe_cpu())
    table = backend.ops.with_overrides("triton", **cuda_op_overrides())
    try:
        table.rms_norm(torch.ones(1, 4), torch.ones(4), 1e-5)
    except Exception as exc:  # compiled kernels refuse CPU tensors; a half-interpreted triton fails oddly
        return Unavailable("cuda", f"{cuda_reason}; the Triton kernels cannot run under the interpreter in this "
                                   f"process ({type(exc).__name__}: {str(exc).splitlines()[0][:160]}): triton was "
                                   "imported before TRITON_INTERPRET=1 was set; run "
                                   "`TRITON_INTERPRET=1 hyspec conformance --backend cuda`")
    backend.ops = table
    backend.name = "cuda-interpreter"
    # decode and verification steps go through the engine's captured-step path as on a GPU; a "replay" reruns
    # the forward with host reads forbidden and must launch what the capture launched (graph_capture's doc)
    from hyspec.cuda_ops.common import interpreter_launches

    backend.graph_capturer = lambda: ReexecutingCapturer(interpreter_launches)
    note = (f"{cuda_reason}: the Triton kernels run under TRITON_INTERPRET=1 on CPU tensors (correctness only); "
            "steps that fit a CUDA graph are replayed by re-execution with the launch and host-read checks")
    return Target("cuda", INTERPRETER, torch.device("cpu"), backend, {}, note)


@contextlib.contextmanager
def engine_backend(target: Target) -> Iterator[str]:
    """``backend=`` for ``LLM(...)`` inside the block; injects the target's Backend when it has no name of its own.

    LLMEngine resolves its backend by name through ``hyspec.backends.registry``;
    the interpreter target is not a backend the registry can build, so the
    lookup is redirected to it while the engine (and its drafters) are built.
    """
    if target.engine_backend_name is not None:
        yield target.engine_backend_name
        return
    original = registry.get_backend
    registry.get_backend = lambda name=None: target.backend
    try:
        yield "cpu"
    finally:
        registry.get_backend = original


__all__ = ["INTERPRETER", "NAMES", "NATIVE", "Target", "Unavailable", "engine_backend", "op_notes", "resolve"]
