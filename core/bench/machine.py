"""The machine a benchmark ran on: what it is, its copy bandwidth, and peak memory per configuration.

Bandwidth limit of plain decoding.  A plain decode step reads every weight
the step uses once, so at batch size B it cannot produce more than
``B * bandwidth / weight_bytes`` tokens per second, however fast the
arithmetic.  ``bandwidth`` is measured as a large tensor copy (``clone``), best
of several, counted STREAM-style: bytes read plus bytes written.  Weights
that fit in a cache (tiny test models) can beat the limit; it is a bound for
models larger than the last-level cache.

Peak memory.  On Linux the kernel's resident high-water mark (VmHWM) is reset
per configuration (``/proc/self/clear_refs``), so each configuration reports
the largest resident set of the process while it ran: Python, torch, the
loaded weights and caches included.  Where the reset is not possible the
figure is ``getrusage``'s high-water mark of the whole run so far, and
``method`` says so.  On an accelerator the device's peak allocation is
reported beside it.
"""
from __future__ import annotations

import os
import platform
import re
import resource
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from hyspec import __version__
from hyspec.backends.cpuinfo import read_cpu_facts, usable_cores
from hyspec.backends.meminfo import host_memory

PROC_STATUS = Path("/proc/self/status")
CLEAR_REFS = Path("/proc/self/clear_refs")


def machine_info(backend: Any) -> dict[str, Any]:
    """CPU, cores, memory, accelerator, library versions and the backend, for the JSON and table header."""
    cpu = read_cpu_facts()
    mem = host_memory()
    info: dict[str, Any] = {
        "cpu_model": cpu.model_name or platform.processor() or "unknown CPU",
        "arch": cpu.arch,
        "physical_cores": cpu.physical_cores,
        "logical_cores": cpu.logical_cores,
        "usable_cores": usable_cores(),
        "torch_threads": torch.get_num_threads(),
        "memory_bytes": None if mem is None else mem.total_bytes,
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "torch_version": torch.__version__,
        "transformers_version": _version("transformers"),
        "hyspec_version": __version__,
        "backend": backend.name,
        "device": str(backend.device),
        "accelerator": _accelerator_name(backend.device),
    }
    return info


def machine_label(info: dict[str, Any]) -> str:
    """One line naming the machine, for table headers and the README."""
    cores = info.get("usable_cores") or info.get("logical_cores")
    mem = info.get("memory_bytes")
    parts = [info.get("cpu_model") or "unknown CPU", f"{cores} cores" if cores else None,
             f"{mem / 2**30:.0f} GiB" if mem else None]
    if info.get("accelerator"):
        parts.append(info["accelerator"])
    parts.append(f"backend {info.get('backend')}, torch {info.get('torch_version')}")
    return ", ".join(p for p in parts if p)


def _version(package: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def _accelerator_name(device: torch.device) -> str | None:
    if device.type == "cpu":
        return None
    module = getattr(torch, device.type, None)
    try:
        return str(module.get_device_name(device))
    except Exception:  # a backend without device names: the device string says enough
        return str(device)


def synchronize(device: torch.device) -> None:
    module = getattr(torch, device.type, None)
    if device.type != "cpu" and module is not None and hasattr(module, "synchronize"):
        module.synchronize(device)


def measure_copy_bandwidth(num_bytes: int, device: torch.device, repeats: int = 5) -> dict[str, Any]:
    """Copy bandwidth in bytes/s: the best of ``repeats`` clones of a ``num_bytes`` tensor (read + write)."""
    src = torch.ones(num_bytes, dtype=torch.uint8, device=device)  # touched, so no page faults are timed
    dst = torch.empty_like(src)
    dst.copy_(src)  # warm: first touch of the destination pages
    synchronize(device)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        dst.copy_(src)
        synchronize(device)
        best = min(best, time.perf_counter() - start)
    del src, dst
    return {"bytes": num_bytes, "repeats": repeats, "best_seconds": best,
            "bytes_per_s": 2 * num_bytes / best, "method": "tensor copy, best of repeats, read + write bytes"}


def decode_weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of weights one plain decode step reads: every parameter and persistent buffer (quantized codes and
    scales) once, except an untied input embedding.

    An input embedding only reads one row per token; when it is tied to the
    lm_head the shared matrix is read in full by the lm_head and counted once.
    """
    embed = getattr(model, "embed_tokens", None)
    embed_weight = getattr(embed, "weight", None)
    # Tied: an lm_head module holding the same Parameter, hyspec's CausalLM's ``lm_head_weight`` (no
    # lm_head module), or another parameter on the same storage (a packed copy sharing it, where a
    # backend keeps one inside the model).
    heads = (getattr(getattr(model, "lm_head", None), "weight", None), getattr(model, "lm_head_weight", None))
    tied = embed_weight is not None and (any(h is embed_weight for h in heads) or any(
        p is not embed_weight and _storage(p) == _storage(embed_weight) for p in model.parameters()))
    # A quantized lm_head (hyspec.model.quantize_model) is read instead of the dense tied matrix.
    report = getattr(model, "quantization", None)
    head_bytes = getattr(report, "head_bytes", 0) or 0
    if head_bytes:
        tied = False
    seen: set[tuple[int, int]] = set()
    total = head_bytes
    for p in model.parameters():
        if _storage(p) in seen:
            continue
        seen.add(_storage(p))
        if p is embed_weight and not tied:
            continue
        total += p.numel() * p.element_size()
    for module in model.modules():  # quantized linears keep their codes and scales as buffers
        for name, buf in module.named_buffers(recurse=False):
            if name not in module._non_persistent_buffers_set and _storage(buf) not in seen:
                seen.add(_storage(buf))
                total += buf.numel() * buf.element_size()
    return total


def _storage(p: torch.Tensor) -> tuple[int, int]:
    """Identity of a parameter's memory: parameters that share it are one tensor read once."""
    return p.data_ptr(), p.numel()


def unique_parameter_count(model: torch.nn.Module) -> int:
    """Parameters counted once per storage (a tied or packed-and-shared weight is one tensor); a quantized
    linear (codes in buffers, no ``weight`` parameter) counts its ``in_features x out_features``."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for p in model.parameters():
        if _storage(p) not in seen:
            seen.add(_storage(p))
            total += p.numel()
    for m in model.modules():
        if hasattr(m, "in_features") and not isinstance(getattr(m, "weight", None), torch.nn.Parameter):
            total += m.in_features * m.out_features
    return total


@dataclass(frozen=True)
class MemoryPeak:
    rss_bytes: int | None
    device_bytes: int | None
    method: str


class PeakMemory:
    """Resident-set (and device) high-water mark over one configuration: ``reset()``, run, ``read()``."""

    def __init__(self, device: torch.device):
        self.device = device
        self.resettable = _can_reset_hwm()

    def reset(self) -> None:
        if self.resettable:
            CLEAR_REFS.write_text("5")  # "5": reset the peak RSS counter (Linux >= 4.0)
        module = getattr(torch, self.device.type, None)
        if self.device.type != "cpu" and hasattr(module, "reset_peak_memory_stats"):
            module.reset_peak_memory_stats(self.device)

    def read(self) -> MemoryPeak:
        if self.resettable:
            rss, method = _status_kib("VmHWM") * 1024, "VmHWM reset per configuration"
        else:
            rss = _ru_maxrss_bytes()
            method = "getrusage high-water mark of the whole run (no per-configuration reset here)"
        device_bytes = None
        module = getattr(torch, self.device.type, None)
        if self.device.type != "cpu" and hasattr(module, "max_memory_allocated"):
            device_bytes = int(module.max_memory_allocated(self.device))
        return MemoryPeak(rss, device_bytes, method)


def _status_kib(field_name: str) -> int:
    match = re.search(rf"^{field_name}:\s+(\d+)\s+kB", PROC_STATUS.read_text(), re.M)
    if match is None:
        raise ValueError(f"{field_name} not in {PROC_STATUS}")
    return int(match.group(1))


def _ru_maxrss_bytes() -> int:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # macOS reports bytes, Linux KiB


def _can_reset_hwm() -> bool:
    if not (PROC_STATUS.is_file() and CLEAR_REFS.exists() and os.access(CLEAR_REFS, os.W_OK)):
        return False
    try:
        CLEAR_REFS.write_text("5")
        _status_kib("VmHWM")
        return True
    except (OSError, ValueError):
        return False
