"""The CUDA backend: torch.cuda devices, Triton kernels from hyspec.cuda_ops.

Code here may assume a CUDA build of torch but must not initialise CUDA at
import: devices are touched only when a backend method is called.
"""
from __future__ import annotations

from types import ModuleType

import torch

from hyspec.backends.accelerator import AcceleratorBackend
from hyspec.backends.records import CudaCapabilities


class CUDABackend(AcceleratorBackend):
    name = "cuda"
    device_type = "cuda"
    ops_module = "hyspec.cuda_ops"
    ops_function = "cuda_op_overrides"
    ops_source = "triton"

    def __init__(self, capabilities: CudaCapabilities, device_index: int = 0):
        super().__init__(capabilities, device_index)

    def device_module(self) -> ModuleType:
        return torch.cuda

    def graph_capturer(self):
        from hyspec.backends.cuda_graphs import CUDAGraphCapturer

        return CUDAGraphCapturer(self.device)
