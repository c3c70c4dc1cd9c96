"""The capability probe: what this node can run, as one ``ProbeReport``.

``probe()`` asks each backend once per process (``fresh=True`` asks again)
and applies the selection on every call, since ``HYSPEC_BACKEND`` or the
forced name may differ between calls.  The NPU is probed first and without
torch, because a torch_npu that breaks ``import torch`` must be diagnosed
before this process imports torch itself.
"""
from __future__ import annotations

import platform
import sys
import threading
from dataclasses import dataclass

from hyspec import __version__
from hyspec.backends.cpuinfo import read_cpu_facts, usable_cores
from hyspec.backends.installed import dist_version
from hyspec.backends.meminfo import host_memory
from hyspec.backends.probe_dist import probe_dist
from hyspec.backends.probe_npu import DEFAULT_TIMEOUT_S as NPU_TIMEOUT_S
from hyspec.backends.probe_npu import probe_npu
from hyspec.backends.records import (
    BackendReport,
    CpuCapabilities,
    CudaCapabilities,
    DistCapabilities,
    NpuCapabilities,
    SELECTION_ORDER,
    ProbeReport,
    drafting_methods,
)
from hyspec.backends.selection import requested_backend, select_backend
from hyspec.errors import HyspecError

HINT_ORT = "pip install 'hyspec[cpu]' (installs onnxruntime)"


@dataclass(frozen=True)
class _Hardware:
    """The per-process cached part of a probe: hardware records, before any selection."""

    cpu: CpuCapabilities
    cuda: CudaCapabilities
    npu: NpuCapabilities


_lock = threading.Lock()
_hardware: _Hardware | None = None
_dist: dict[str | None, DistCapabilities] = {}


def probe(ray_address: str | None = None, backend: str | None = None, *, fresh: bool = False,
          npu_timeout_s: float = NPU_TIMEOUT_S) -> ProbeReport:
    """What this node can run.  ``backend`` forces a choice (else HYSPEC_BACKEND, else auto).

    Raises ConfigError for an unknown backend name and BackendUnavailableError
    when the forced backend cannot run here.
    """
    requested, requested_by = requested_backend(backend)  # bad names fail before any probing
    hardware = _probe_hardware(fresh, npu_timeout_s)
    with _lock:
        if fresh or ray_address not in _dist:
            _dist[ray_address] = probe_dist(ray_address)
        dist = _dist[ray_address]
    records = {"cpu": hardware.cpu, "cuda": hardware.cuda, "npu": hardware.npu}
    selected = select_backend(requested, requested_by,
                              {name: (r.available, r.reason, r.hint) for name, r in records.items()})
    return ProbeReport(
        selected=selected,
        requested=requested,
        requested_by=requested_by,
        backends=tuple(_backend_report(name, records[name]) for name in SELECTION_ORDER),
        dist=dist,
        platform=_platform(),
        hyspec_version=__version__,
    )


def clear_cache() -> None:
    """Forget every probe result (tests; a process whose hardware changed)."""
    global _hardware
    with _lock:
        _hardware = None
        _dist.clear()
    from hyspec.backends import registry

    registry.clear_cache()


def _probe_hardware(fresh: bool, npu_timeout_s: float) -> _Hardware:
    global _hardware
    with _lock:
        if _hardware is None or fresh:
            npu = probe_npu(timeout_s=npu_timeout_s)  # before torch is imported here: see the docstring
            _require_importable_torch(npu, torch_imported="torch" in sys.modules)
            from hyspec.backends.probe_cuda import probe_cuda

            _hardware = _Hardware(cpu=probe_cpu(), cuda=probe_cuda(), npu=npu)
            if fresh:  # backends built from the old records rebuild their op tables too
                from hyspec.backends import registry

                registry.clear_cache()
        return _hardware


def _require_importable_torch(npu: NpuCapabilities, torch_imported: bool) -> None:
    """When autoload breaks ``import torch`` and torch is not imported yet, stop with the fix."""
    if npu.failure_mode == "autoload_broken" and not torch_imported:
        raise HyspecError(f"{npu.reason}; {npu.hint}")


def probe_cpu() -> CpuCapabilities:
    import torch

    facts = read_cpu_facts()
    memory = host_memory()
    try:
        capability = torch.backends.cpu.get_cpu_capability()
    except (AttributeError, RuntimeError):  # torch older than 2.1
        capability = None
    ort_version, ort_providers, ort_reason = _onnxruntime()
    unknown = list(facts.unknown_fields)
    if memory is None:
        unknown += ["memory_total_bytes", "memory_available_bytes"]
    elif memory.available_bytes is None:
        unknown.append("memory_available_bytes")
    if capability is None:
        unknown.append("torch_cpu_capability")
    return CpuCapabilities(
        arch=facts.arch, vendor=facts.vendor, model_name=facts.model_name, physical_cores=facts.physical_cores,
        logical_cores=facts.logical_cores, usable_cores=usable_cores(),
        memory_total_bytes=memory.total_bytes if memory else None,
        memory_available_bytes=memory.available_bytes if memory else None,
        isa=facts.isa, torch_cpu_capability=capability, onnxruntime_version=ort_version,
        onnxruntime_providers=ort_providers, onnxruntime_reason=ort_reason, source=facts.source,
        unknown_fields=tuple(unknown),
    )


def _onnxruntime() -> tuple[str | None, tuple[str, ...], str | None]:
    """(version, providers, reason it is unusable) - imported lazily, only here."""
    if dist_version("onnxruntime") is None and dist_version("onnxruntime-gpu") is None:
        return None, (), f"onnxruntime is not installed ({HINT_ORT})"
    try:
        import onnxruntime
    except Exception as exc:  # a broken wheel: say so, the CPU backend still runs on torch
        return None, (), f"import onnxruntime fails: {type(exc).__name__}: {exc}"
    return onnxruntime.__version__, tuple(onnxruntime.get_available_providers()), None


def _backend_report(name: str, capabilities) -> BackendReport:
    if not capabilities.available:
        return BackendReport(name=name, capabilities=capabilities, methods=(), op_sources=())
    from hyspec.backends.registry import backend_for

    backend = backend_for(name, capabilities)
    sources = backend.ops.sources
    # every method runs on the reference ops, so each runs wherever a backend does
    return BackendReport(name=name, capabilities=capabilities, methods=drafting_methods(),
                         op_sources=tuple(sources.items()), ops_note=getattr(backend, "ops_note", None),
                         quantization=tuple(backend.quantization_kernels()))


def _platform() -> tuple[tuple[str, str], ...]:
    return (("system", platform.system()), ("machine", platform.machine()),
            ("python", platform.python_version()), ("torch", dist_version("torch") or "not installed"))
