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

    def __init__(self, capabilities: NpuCapabilities, device_index: int = 0):
        # torch_npu registers the "npu" device type with torch; torch.device("npu") needs it first
        importlib.import_module("torch_npu")
        super().__init__(capabilities, device_index)

    def device_module(self) -> ModuleType:
        import torch_npu

        return torch_npu.npu
