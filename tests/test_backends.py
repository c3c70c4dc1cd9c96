"""Backends: CPU memory and KV budget, op tables from op packages, accelerator memory/streams, the registry."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import types

import pytest
import torch

from hyspec.backend import MemoryStats
from hyspec.backends import cpu as cpu_module
from hyspec.backends.accelerator import AcceleratorBackend
from hyspec.backends.cpu import DEFAULT_CPU_KV_BYTES, CPUBackend
from hyspec.backends.cuda import CUDABackend
from hyspec.backends.meminfo import HostMemory
from hyspec.backends.optable import resolve_ops
from hyspec.backends.probe import clear_cache, probe
from hyspec.backends.records import CudaCapabilities
from hyspec.backends.registry import get_backend
from hyspec.errors import ConfigError
from hyspec.ops import OP_NAMES, REFERENCE

GiB = 1 << 30


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    monkeypatch.delenv("HYSPEC_BACKEND", raising=False)
    clear_cache()
    yield
    clear_cache()


def cpu_backend(monkeypatch, total: int, available: int | None) -> CPUBackend:
    monkeypatch.setattr(cpu_module, "host_memory", lambda: HostMemory(total_bytes=total, available_bytes=available))
    return CPUBackend(probe().backend("cpu").capabilities)


# --- CPU ---------------------------------------------------------------------------------------------------

def test_cpu_memory_stats_are_host_memory(monkeypatch):
    assert cpu_backend(monkeypatch, 32 * GiB, 20 * GiB).memory_stats() == MemoryStats(32 * GiB, 20 * GiB)


def test_cpu_memory_stats_on_this_machine():
    stats = get_backend("cpu").memory_stats()
    assert 0 < stats.free_bytes <= stats.total_bytes


def test_cpu_kv_budget_defaults_to_2_gib_capped_by_available_memory(monkeypatch):
    backend = cpu_backend(monkeypatch, 32 * GiB, 20 * GiB)
    assert backend.kv_cache_budget_bytes(0.9) == DEFAULT_CPU_KV_BYTES == 2 * GiB
    assert backend.kv_cache_budget_bytes(0.9, cpu_kv_bytes=8 * GiB) == 8 * GiB
    assert backend.kv_cache_budget_bytes(0.25, cpu_kv_bytes=8 * GiB) == 5 * GiB  # 25% of 20 GiB available
    small = cpu_backend(monkeypatch, 4 * GiB, 1 * GiB)
    assert small.kv_cache_budget_bytes(0.5) == GiB // 2


def test_cpu_kv_budget_when_the_os_does_not_say_what_is_free(monkeypatch):
    assert cpu_backend(monkeypatch, 8 * GiB, None).kv_cache_budget_bytes(0.1) == int(8 * GiB * 0.1)


@pytest.mark.parametrize("fraction, kv_bytes", [(0.0, None), (1.5, None), (0.5, 0), (0.5, -1), (0.5, 1.5),
                                                (0.5, True)])
def test_cpu_kv_budget_rejects_bad_input(monkeypatch, fraction, kv_bytes):
    with pytest.raises(ValueError):
        cpu_backend(monkeypatch, 8 * GiB, 4 * GiB).kv_cache_budget_bytes(fraction, cpu_kv_bytes=kv_bytes)


def test_cpu_backend_streams_and_synchronize_are_in_order_no_ops():
    backend = get_backend("cpu")
    for priority in ("high", "normal", "low"):
        with backend.stream(priority):
            pass
    backend.synchronize()
    with pytest.raises(ValueError, match="priority"):
        backend.stream("urgent")


# --- op tables ---------------------------------------------------------------------------------------------

def ops_package(monkeypatch, name: str, **attrs) -> None:
    module = types.ModuleType(name)
    module.__dict__.update(attrs)
    monkeypatch.setitem(sys.modules, name, module)


def fast_rms_norm(*args, **kwargs):
    raise AssertionError("not called in these tests")


def test_overrides_replace_reference_ops_and_are_labelled(monkeypatch):
    ops_package(monkeypatch, "fake_ops", fake_op_overrides=lambda: {"rms_norm": fast_rms_norm})
    resolved = resolve_ops("fake_ops", "fake_op_overrides", source="triton")
    assert resolved.table.rms_norm is fast_rms_norm and resolved.note is None
    assert resolved.table.sources["rms_norm"] == "triton"
    assert resolved.table.native_ops() == ["rms_norm"]
    assert all(resolved.table.sources[op] == REFERENCE for op in OP_NAMES if op != "rms_norm")


def test_missing_package_or_function_falls_back_to_reference_with_a_note(monkeypatch):
    missing = resolve_ops("no_such_ops_package", "x_op_overrides", source="triton")
    assert missing.table.native_ops() == [] and "cannot be imported" in missing.note
    ops_package(monkeypatch, "empty_ops")
    empty = resolve_ops("empty_ops", "x_op_overrides", source="triton")
    assert empty.table.native_ops() == [] and "has no x_op_overrides()" in empty.note


def test_a_failing_override_provider_falls_back_and_says_why(monkeypatch, caplog):
    def broken():
        raise ImportError("No module named 'triton'")

    ops_package(monkeypatch, "broken_ops", x_op_overrides=broken)
    resolved = resolve_ops("broken_ops", "x_op_overrides", source="triton")
    assert resolved.table.native_ops() == []
    assert "ImportError: No module named 'triton'" in resolved.note and resolved.note in caplog.text


def test_unknown_or_uncallable_overrides_are_ignored_the_rest_kept(monkeypatch):
    ops_package(monkeypatch, "odd_ops", x_op_overrides=lambda: {"rms_norm": fast_rms_norm, "flash": print,
                                                                  "rotary": 42})
    resolved = resolve_ops("odd_ops", "x_op_overrides", source="triton")
    assert resolved.table.native_ops() == ["rms_norm"]
    assert "['flash']" in resolved.note and "['rotary']" in resolved.note


def test_the_probe_reads_native_ops_from_the_backend_object(monkeypatch):
    ops_package(monkeypatch, "hyspec.cpu_ops", cpu_op_overrides=lambda: {"rms_norm": fast_rms_norm})
    cpu = probe(fresh=True).backend("cpu")
    assert cpu.native_ops == ("rms_norm",) and dict(cpu.op_sources)["rms_norm"] == "cpu_ops"
    assert cpu.to_dict()["native_ops"] == ["rms_norm"]


# --- accelerators (CUDA API faked: no GPU needed) ----------------------------------------------------------

def cuda_caps(count: int = 1) -> CudaCapabilities:
    return CudaCapabilities(available=True, reason=None, hint=None, torch_cuda_version="12.8", device_count=count,
                            devices=(), triton_version=None, triton_can_compile=None, triton_reason=None)


class FakeDeviceModule:
    """torch.cuda's memory/stream API, recording calls."""

    def __init__(self):
        self.calls = []

    reserved = allocated = 0  # the caching allocator: held by this process / in use

    def mem_get_info(self, device):
        return 60 * GiB, 80 * GiB

    def memory_reserved(self, device):
        return self.reserved

    def memory_allocated(self, device):
        return self.allocated

    def empty_cache(self):
        self.calls.append(("empty_cache",))

    def set_per_process_memory_fraction(self, fraction, device):
        self.calls.append(("fraction", fraction, str(device)))

    def synchronize(self, device):
        self.calls.append(("sync", str(device)))

    def Stream(self, device, priority):  # noqa: N802 - mirrors torch.cuda.Stream
        self.calls.append(("new stream", priority))
        return ("stream", priority)

    def stream(self, s):
        self.calls.append(("use", s))
        from contextlib import nullcontext

        return nullcontext()


class FakeAccelerator(AcceleratorBackend):
    name = device_type = "cuda"
    ops_module, ops_function, ops_source = "no_such_ops_package", "x_op_overrides", "triton"

    def __init__(self, caps, device_index=0):
        super().__init__(caps, device_index)
        self.fake = FakeDeviceModule()

    def device_module(self):
        return self.fake


def test_accelerator_budget_takes_a_fraction_of_free_memory_and_caps_nothing():
    backend = FakeAccelerator(cuda_caps(2), device_index=1)
    assert backend.device == torch.device("cuda", 1)
    assert backend.memory_stats() == MemoryStats(total_bytes=80 * GiB, free_bytes=60 * GiB)
    assert backend.kv_cache_budget_bytes(0.5) == 30 * GiB
    # no per-process cap: a second engine in the process (the bench's judge) would starve the first, and a
    # cap of 0.8 of total with a pool of 0.8 of free left no room for activations (seen on an H200)
    assert backend.fake.calls == []
    with pytest.raises(ValueError):
        backend.kv_cache_budget_bytes(0.0)


def test_accelerator_counts_memory_its_allocator_holds_unused_as_free():
    backend = FakeAccelerator(cuda_caps())
    backend.fake.reserved, backend.fake.allocated = 18 * GiB, 8 * GiB  # a closed engine's pool, cached
    assert backend.memory_stats().free_bytes == 60 * GiB + 10 * GiB
    assert backend.kv_cache_budget_bytes(0.5) == 35 * GiB
    backend.fake.reserved = 200 * GiB  # never more than the device has
    assert backend.memory_stats().free_bytes == 80 * GiB
    backend.release_cached_memory()
    assert backend.fake.calls == [("empty_cache",)]


def test_accelerator_streams_high_and_low_priority_made_once():
    backend = FakeAccelerator(cuda_caps())
    for _ in range(2):
        with backend.stream("high"), backend.stream("low"), backend.stream("normal"):
            pass
    made = [c for c in backend.fake.calls if c[0] == "new stream"]
    assert made == [("new stream", -1), ("new stream", 0)]  # lower number = more urgent
    backend.synchronize()
    assert backend.fake.calls[-1] == ("sync", "cuda:0")


def test_accelerator_rejects_a_device_that_does_not_exist():
    with pytest.raises(ValueError, match="cuda:2 does not exist: 2 device"):
        FakeAccelerator(cuda_caps(2), device_index=2)


def test_cuda_backend_takes_its_ops_from_hyspec_cuda_ops(monkeypatch):
    ops_package(monkeypatch, "hyspec.cuda_ops", cuda_op_overrides=lambda: {"rms_norm": fast_rms_norm})
    backend = CUDABackend(cuda_caps())  # building it touches no GPU
    assert backend.device == torch.device("cuda", 0)
    assert backend.ops.sources["rms_norm"] == "triton" and backend.ops.rms_norm is fast_rms_norm


STAND_IN_TORCH_NPU = """\
    import contextlib
    import types
    import torch

    torch.utils.rename_privateuse1_backend("npu")  # what torch_npu does, so torch.device("npu") parses
    calls = []
    npu = types.SimpleNamespace(
        mem_get_info=lambda device: (30 * 2**30, 64 * 2**30),
        set_per_process_memory_fraction=lambda f, device: calls.append(("fraction", f, str(device))),
        synchronize=lambda device: calls.append(("sync", str(device))),
        Stream=lambda device, priority: ("stream", priority),
        stream=lambda s: contextlib.nullcontext(),
    )
"""

NPU_CHECK = """\
import json, sys, types
from hyspec.backends.npu import NPUBackend
assert "torch_npu" not in sys.modules  # importing the module imported nothing
caps = types.SimpleNamespace(device_count=1)
b = NPUBackend(caps)
import torch_npu
budget = b.kv_cache_budget_bytes(0.5)
with b.stream("high"):
    b.synchronize()
print(json.dumps({"device": str(b.device), "budget": budget, "calls": torch_npu.calls,
                  "ops": b.ops.sources, "note": b.ops_note}))
"""


def test_npu_backend_with_a_stand_in_torch_npu(tmp_path):
    (tmp_path / "torch_npu").mkdir()
    (tmp_path / "torch_npu" / "__init__.py").write_text(textwrap.dedent(STAND_IN_TORCH_NPU))
    r = subprocess.run([sys.executable, "-c", NPU_CHECK], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PYTHONPATH": str(tmp_path), "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["device"] == "npu:0" and out["budget"] == 15 * 2**30
    assert out["calls"] == [["sync", "npu:0"]]  # no per-process memory cap
    assert set(out["ops"]) == set(OP_NAMES)  # reference ops unless hyspec.npu_ops overrides some


# --- registry ----------------------------------------------------------------------------------------------

def test_get_backend_resolves_through_the_selection_and_caches(monkeypatch):
    backend = get_backend()
    assert backend.name == probe().selected
    assert get_backend(probe().selected) is backend
    assert get_backend("cpu").name == "cpu"
    monkeypatch.setenv("HYSPEC_BACKEND", "tpu")
    with pytest.raises(ConfigError, match="valid names"):
        get_backend()


def test_importing_backend_modules_imports_no_vendor_package():
    code = ("import sys; import hyspec.backends.probe, hyspec.backends.registry, hyspec.backends.cpu, "
            "hyspec.backends.cuda, hyspec.backends.npu, hyspec.cli.probe; "
            "bad = [m for m in ('torch_npu', 'triton', 'onnxruntime', 'ray') if m in sys.modules]; "
            "print(bad); sys.exit(1 if bad else 0)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr


def test_cli_probe_module_does_not_import_torch():
    # needed to diagnose a torch_npu whose autoload breaks `import torch`
    code = "import sys, hyspec.cli.probe, hyspec.backends.probe; sys.exit('torch' in sys.modules)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
