"""The probe's records: what each backend and the cluster can do, as frozen values.

Each record converts itself to the JSON of docs/probe.md (schema version
``SCHEMA_VERSION``).  Fields that could not be determined are ``None`` (JSON
``null``), never a guess.  This module imports nothing heavy: the CLI reads it
before torch is imported.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any

from hyspec.spec.registry import method_names

#: Bump when a field is renamed, removed or changes meaning (adding one does not).
SCHEMA_VERSION = 1

#: The names a user may force with ``--backend`` / ``HYSPEC_BACKEND``.
BACKEND_NAMES = ("cpu", "cuda", "npu")
#: "Ascend first": the order ``auto`` tries backends in.
SELECTION_ORDER = ("npu", "cuda", "cpu")


def drafting_methods() -> tuple[str, ...]:
    """Every drafting method hyspec knows, hybrid included, read from the method table now."""
    return method_names()


X86_ISA_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_tile", "amx_bf16", "amx_int8")
ARM_ISA_FLAGS = ("neon", "sve", "sve2", "bf16")


def to_jsonable(value: Any) -> Any:
    """Records, tuples and frozensets as plain JSON values (records may define ``to_dict``)."""
    if hasattr(value, "to_dict"):
        return value.to_dict()
    if is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_jsonable(getattr(value, f.name)) for f in fields(value)}
    if isinstance(value, (tuple, list)):
        return [to_jsonable(v) for v in value]
    if isinstance(value, frozenset):
        return sorted(to_jsonable(v) for v in value)
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    return value


@dataclass(frozen=True)
class IsaFlags:
    """The ISA extensions that matter to hyspec's CPU paths, for one architecture family."""

    family: str  # "x86", "arm" or "other"
    checked: tuple[str, ...]  # the flags looked for on this family
    present: frozenset[str]  # the checked flags this CPU has
    known: bool  # False when the flags could not be read (then every flag is reported as null)

    def __post_init__(self) -> None:
        stray = self.present - set(self.checked)
        if stray:
            raise ValueError(f"present flags {sorted(stray)} are not among the checked flags {self.checked}")

    def has(self, flag: str) -> bool | None:
        """True/False, or None when the flags are unknown or ``flag`` is not checked on this family."""
        if not self.known or flag not in self.checked:
            return None
        return flag in self.present

    def to_dict(self) -> dict[str, bool | None]:
        return {flag: self.has(flag) for flag in self.checked}


@dataclass(frozen=True)
class CpuCapabilities:
    arch: str  # platform.machine(): "x86_64", "aarch64", "arm64", ...
    vendor: str | None
    model_name: str | None
    physical_cores: int | None
    logical_cores: int | None
    usable_cores: int | None  # the CPUs this process may run on (affinity / cgroup)
    memory_total_bytes: int | None
    memory_available_bytes: int | None
    isa: IsaFlags
    torch_cpu_capability: str | None  # torch.backends.cpu.get_cpu_capability(): "AVX512", "SVE256", ...
    onnxruntime_version: str | None
    onnxruntime_providers: tuple[str, ...]
    onnxruntime_reason: str | None  # why onnxruntime is not usable (None when it is)
    source: str  # where the facts came from: "/proc/cpuinfo", "sysctl" or "platform"
    unknown_fields: tuple[str, ...]  # fields the source could not tell
    available: bool = True  # the CPU backend always runs
    reason: str | None = None
    hint: str | None = None

    def __post_init__(self) -> None:
        for name in ("physical_cores", "logical_cores", "usable_cores", "memory_total_bytes"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ValueError(f"{name} must be positive when known, got {value}")
        if self.source not in ("/proc/cpuinfo", "sysctl", "platform"):
            raise ValueError(f"source must be /proc/cpuinfo, sysctl or platform, got {self.source!r}")


@dataclass(frozen=True)
class CudaDevice:
    index: int
    name: str
    compute_capability: tuple[int, int]
    total_memory_bytes: int
    multiprocessor_count: int
    bf16_supported: bool
    triton_can_compile: bool | None  # None: not checked (Triton absent)
    triton_reason: str | None

    def __post_init__(self) -> None:
        if len(self.compute_capability) != 2:
            raise ValueError(f"compute_capability must be (major, minor), got {self.compute_capability}")

    def to_dict(self) -> dict[str, Any]:
        out = to_jsonable({f.name: getattr(self, f.name) for f in fields(self)})
        out["compute_capability"] = f"{self.compute_capability[0]}.{self.compute_capability[1]}"
        return out


@dataclass(frozen=True)
class CudaCapabilities:
    available: bool
    reason: str | None
    hint: str | None
    torch_cuda_version: str | None  # torch.version.cuda; None for CPU/ROCm builds
    device_count: int
    devices: tuple[CudaDevice, ...]
    triton_version: str | None
    triton_can_compile: bool | None  # True when Triton compiled and ran a kernel on every device
    triton_reason: str | None


@dataclass(frozen=True)
class NpuDevice:
    index: int
    name: str
    total_memory_bytes: int | None


#: Why torch_npu cannot be used (``NpuCapabilities.failure_mode``).
NPU_FAILURE_MODES = (
    "not_installed",  # no torch_npu package
    "cann_missing",  # import torch_npu: libhccl.so / libascendcl.so not found
    "driver_missing",  # import torch_npu: libascend_hal.so / driver libraries not found
    "autoload_broken",  # import torch itself fails while auto-loading torch_npu
    "import_failed",  # import torch_npu fails for another reason
    "timeout",  # the import did not finish in time
    "no_devices",  # torch_npu imports but sees no NPU
    "query_failed",  # torch_npu imports but asking it about devices failed
)


@dataclass(frozen=True)
class NpuCapabilities:
    available: bool
    reason: str | None
    hint: str | None
    installed: bool
    failure_mode: str | None  # one of NPU_FAILURE_MODES, None when available
    import_error: str | None  # the last line of the failing import's error, verbatim
    torch_version: str | None
    torch_npu_version: str | None
    torch_npu_built_for_torch: str | None  # the torch release embedded in torch_npu's version
    version_mismatch: bool | None
    device_count: int
    devices: tuple[NpuDevice, ...]
    soc_name: str | None
    soc_version: int | None
    soc_family: str | None  # "910B/A2", "910_93/A3", "310P", "A5/950", ...
    cann_version: str | None
    cann_home: str | None
    #: the op-plugin branch an emulated torch_npu stands for (HYSPEC_NPU_EMULATE), None on a real stack
    emulated: str | None = None
    #: per op, the torch_npu variants used and why others were rejected (hyspec.npu_ops.plan), when found
    op_plan: dict | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if self.failure_mode is not None and self.failure_mode not in NPU_FAILURE_MODES:
            raise ValueError(f"failure_mode {self.failure_mode!r} is not one of {NPU_FAILURE_MODES}")
        if self.available == (self.failure_mode is not None):
            raise ValueError("an available NPU has no failure_mode, an unavailable one must have one")


@dataclass(frozen=True)
class RayNode:
    node_id: str
    address: str
    alive: bool
    resources: tuple[tuple[str, float], ...]  # ("CPU", 64.0), ("GPU", 8.0), ("NPU", 8.0), ...

    def to_dict(self) -> dict[str, Any]:
        return {"node_id": self.node_id, "address": self.address, "alive": self.alive,
                "resources": dict(self.resources)}


@dataclass(frozen=True)
class DistCapabilities:
    ray_installed: bool
    ray_version: str | None
    address: str | None  # the --ray-address asked about, None when not asked
    connected: bool | None  # None when no address was given
    reason: str | None  # why the cluster could not be read
    nodes: tuple[RayNode, ...] = ()
    cluster_resources: tuple[tuple[str, float], ...] = ()

    def __post_init__(self) -> None:
        if (self.address is None) != (self.connected is None):
            raise ValueError("connected is None exactly when no address was asked about")

    def to_dict(self) -> dict[str, Any]:
        out = to_jsonable({f.name: getattr(self, f.name) for f in fields(self)})
        out["cluster_resources"] = dict(self.cluster_resources)
        return out


@dataclass(frozen=True)
class BackendReport:
    """One backend: its hardware record plus what hyspec can run on it."""

    name: str
    capabilities: CpuCapabilities | CudaCapabilities | NpuCapabilities
    methods: tuple[str, ...]  # drafting methods that run here (empty when unavailable)
    op_sources: tuple[tuple[str, str], ...]  # (op, "reference" | backend source); empty when unavailable
    ops_note: str | None = None  # why the backend's own ops are not in use, if they are not
    quantization: tuple[str, ...] = ()  # weight-only kernels it computes with: "int4", "int8"

    @property
    def available(self) -> bool:
        return self.capabilities.available

    @property
    def native_ops(self) -> tuple[str, ...]:
        return tuple(op for op, source in self.op_sources if source != "reference")

    def to_dict(self) -> dict[str, Any]:
        out = to_jsonable(self.capabilities)
        # the common keys first, so every backend's object reads the same way
        head = {"available": out.pop("available"), "reason": out.pop("reason"), "hint": out.pop("hint")}
        return {
            **head,
            **out,
            "methods": list(self.methods),
            "ops": dict(self.op_sources) if self.op_sources else None,
            "native_ops": list(self.native_ops),
            "ops_note": self.ops_note,
            "quantization": list(self.quantization),
        }


@dataclass(frozen=True)
class ProbeReport:
    selected: str  # the backend hyspec uses: "cpu", "cuda" or "npu"
    requested: str  # "auto" or the forced name
    requested_by: str  # "auto", "argument" (--backend / backend=) or "HYSPEC_BACKEND"
    backends: tuple[BackendReport, ...]  # in SELECTION_ORDER
    dist: DistCapabilities
    platform: tuple[tuple[str, str], ...]  # ("system", "Linux"), ("python", "3.11.7"), ...
    hyspec_version: str
    schema_version: int = SCHEMA_VERSION
    selection_order: tuple[str, ...] = field(default=SELECTION_ORDER)

    def __post_init__(self) -> None:
        names = tuple(b.name for b in self.backends)
        if names != SELECTION_ORDER:
            raise ValueError(f"backends must be {SELECTION_ORDER} in that order, got {names}")
        if self.selected not in BACKEND_NAMES:
            raise ValueError(f"selected must be one of {BACKEND_NAMES}, got {self.selected!r}")

    def backend(self, name: str) -> BackendReport:
        for b in self.backends:
            if b.name == name:
                return b
        raise KeyError(f"no backend {name!r}; backends are {BACKEND_NAMES}")

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": self.schema_version,
            "hyspec_version": self.hyspec_version,
            "selected": self.selected,
            "requested": self.requested,
            "requested_by": self.requested_by,
            "selection_order": list(self.selection_order),
            "platform": dict(self.platform),
            "backends": {b.name: b.to_dict() for b in self.backends},
            "dist": self.dist.to_dict(),
        }

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)
