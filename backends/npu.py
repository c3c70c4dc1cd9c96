"""The Ascend NPU backend: torch.npu devices via torch_npu, fused ops from hyspec.npu_ops.

torch_npu is imported when the backend is built (after the probe found that
its import works), never when this module is imported; importing it does not
initialise a device either.
"""
from __future__ import annotations

import importlib
from types import ModuleType

from hyspec.backends.accelerator import AcceleratorBackend
from hyspec.backends.records import NpuCapabilities


class NPUBackend(AcceleratorBackend):
    name = "npu"
    device_type = "npu"
    ops_module = "hyspec.npu_ops"
    ops_function = "npu_op_overrides"
    ops_source = "torch_npu"

    #: KV budget of an emulated NPU (HYSPEC_NPU_EMULATE) when the caller names none: it is host memory
    EMULATED_KV_BYTES = 256 << 20

    def __init__(self, capabilities: NpuCapabilities, device_index: int = 0):
        # torch_npu registers the "npu" device type with torch; torch.device("npu") needs it first
        module = importlib.import_module("torch_npu")
        self.emulated = getattr(module, "HYSPEC_EMULATION", None)
        if self.emulated:
            self.device_type = "cpu"  # hyspec's emulated torch_npu computes on the host (npu_ops/emulation.py)
        super().__init__(capabilities, device_index if not self.emulated else 0)
        if self.emulated:
            self.name = "npu"

    def default_block_size(self) -> int:
        """128: FIA's PageAttention takes multiples of 128 (up to 512) when more than one query row attends
        (prefill, chains, tree verification), as vllm-ascend's default; smaller blocks run those steps on the
        reference op (hyspec.npu_ops.limits)."""
        from hyspec.npu_ops.limits import RECOMMENDED_BLOCK_SIZE

        return RECOMMENDED_BLOCK_SIZE

    def block_size_rule(self) -> tuple[int, int]:
        """Drafters' KV blocks: multiples of 128 up to 512, the FIA PageAttention range (hyspec.npu_ops.limits)."""
        from hyspec.npu_ops.limits import MAX_BLOCK_SIZE, RECOMMENDED_BLOCK_SIZE

        return RECOMMENDED_BLOCK_SIZE, MAX_BLOCK_SIZE

    def kv_cache_budget_bytes(self, memory_fraction: float, cpu_kv_bytes: int | None = None) -> int:
        if self.emulated:
            return int(cpu_kv_bytes or self.EMULATED_KV_BYTES)
        return super().kv_cache_budget_bytes(memory_fraction, cpu_kv_bytes)

    def device_module(self) -> ModuleType:
        import torch_npu

        return torch_npu.npu
