"""``get_backend()``: the Backend object hyspec runs on, resolved through the probe.

One instance per backend name per process: building one resolves its op
table (importing kernel packages), which should happen once.
"""
from __future__ import annotations

import threading
from typing import Any

from hyspec.backend import Backend

_lock = threading.Lock()
_instances: dict[str, tuple[Any, Backend]] = {}  # name -> (capabilities it was built from, backend)


def get_backend(name: str | None = None) -> Backend:
    """The backend named ``name`` ("cpu", "cuda", "npu", "auto"; None: HYSPEC_BACKEND or auto).

    Raises ConfigError for an unknown name and BackendUnavailableError when
    the named backend cannot run here.
    """
    from hyspec.backends.probe import probe

    report = probe(backend=name)
    return backend_for(report.selected, report.backend(report.selected).capabilities)


def backend_for(name: str, capabilities: Any) -> Backend:
    """The cached backend ``name`` built from ``capabilities`` (rebuilt when they change)."""
    with _lock:
        cached = _instances.get(name)
        if cached is not None and cached[0] == capabilities:
            return cached[1]
        backend = _construct(name, capabilities)
        _instances[name] = (capabilities, backend)
        return backend


def clear_cache() -> None:
    with _lock:
        _instances.clear()


def _construct(name: str, capabilities: Any) -> Backend:
    if name == "cpu":
        from hyspec.backends.cpu import CPUBackend

        return CPUBackend(capabilities)
    if name == "cuda":
        from hyspec.backends.cuda import CUDABackend

        return CUDABackend(capabilities)
    if name == "npu":
        from hyspec.backends.npu import NPUBackend

        return NPUBackend(capabilities)
    raise KeyError(f"no backend {name!r}; backends are cpu, cuda, npu")
