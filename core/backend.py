"""The backend seam: what core needs from a piece of hardware.

``backends/`` implements this once per hardware kind (npu.py, cuda.py,
cpu.py).  A backend module may assume its hardware but must not initialise
it at import, and imports its vendor package (torch_npu, triton,
onnxruntime) lazily, so that ``import hyspec`` works on a bare CPU box.
"""
from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ContextManager

import torch

from hyspec.ops import OpTable

if TYPE_CHECKING:
    from hyspec.graph_capture import GraphCapturer
    from hyspec.model.quant import GroupQuantized


@dataclass(frozen=True)
class MemoryStats:
    total_bytes: int
    free_bytes: int


class Backend(ABC):
    """One kind of hardware: a device, its capabilities and its op table."""

    name: str = "abstract"

    def __init__(self, device: torch.device, capabilities: Any, ops: OpTable):
        self.device = device
        self.capabilities = capabilities  # the probe's record for this backend
        self.ops = ops

    @abstractmethod
    def memory_stats(self) -> MemoryStats:
        """Memory of the device as the backend sees it (host RAM on CPU)."""

    def release_cached_memory(self) -> None:
        """Give memory an allocator keeps for reuse back to the device; called when an engine closes."""

    def optimize_model(self, model: "torch.nn.Module") -> "torch.nn.Module":
        """Prepare a loaded model for serving on this backend (e.g. pack weights); same interface after.

        Called by the engine on the target and on every drafter module.  A
        backend may only swap submodules for drop-in ones of its own (the CPU
        backend's packed linears); it never patches methods or attributes of
        core objects: what a model computes otherwise goes through ``self.ops``
        (the lm-head matmul is the ``logits`` op).  The default changes nothing.
        """
        return model

    def default_block_size(self) -> int:
        """KV tokens per page when the user names none (``block_size=None``): what this backend's kernels want."""
        return 16

    def block_size_rule(self) -> tuple[int, int | None] | None:
        """(multiple, largest) block size the kernels take for models that let the pool choose (drafters);
        None: as many tokens as fit a page, in multiples of 16."""
        return None

    def graph_capturer(self) -> "GraphCapturer | None":
        """What records a step's forward once and replays it (hyspec.engine.step_graphs); None: steps run
        eagerly.  The CUDA backend returns its CUDA-graph capturer; CPU and NPU have none."""
        return None

    def quantization_kernels(self) -> tuple[str, ...]:
        """Weight-only kinds this backend computes with (``"int4"``, ``"int8"``); the probe reports them."""
        return ()

    def quantized_linear(self, w: "GroupQuantized", bias: "torch.Tensor | None",
                         dtype: "torch.dtype", activations: str = "native") -> "torch.nn.Module | None":
        """A drop-in ``nn.Linear`` computing with the codes of ``w`` (hyspec.model.quant) on activations of
        ``dtype``, or None when this backend has no kernel for it (the loader then keeps dequantized
        weights, or errors when asked for it).  ``activations="int8"``: the activations rounded to 8 bits
        per block before the product (``quantization="a8"``)."""
        return None

    def quantized_activation_dtype(self) -> "torch.dtype | None":
        """The activation dtype ``dtype="auto"`` means for a quantized checkpoint computed with its codes
        (None: the checkpoint's own, as for dense weights)."""
        return None

    def int8_activations_refusal(self, dtype: "torch.dtype") -> str | None:
        """Why ``quantized_linear(..., activations="int8")`` returns None here (the end of ``quantization="a8"``'s
        error), or None when there is nothing more to say than that the backend has no such kernel."""
        return None

    def quantized_head(self, weight: "torch.Tensor", w: "GroupQuantized",
                       dtype: "torch.dtype", activations: str = "native") -> "torch.nn.Module | None":
        """Let the ``logits`` op multiply by ``w``'s codes wherever it is given the dense lm_head ``weight``
        (tied embeddings keep the dense table for the lookup); the module it uses, or None when it cannot."""
        return None

    def synchronize(self) -> None:
        """Wait for queued device work (no-op where work is synchronous)."""

    def stream(self, priority: str = "normal") -> ContextManager[None]:
        """Run enclosed work on a stream of the given priority ('high', 'normal', 'low').

        Target work goes on 'high', draft work on 'low'.  Backends without
        streams run everything in order.
        """
        if priority not in ("high", "normal", "low"):
            raise ValueError(f"stream priority must be 'high', 'normal' or 'low', not {priority!r}")
        return contextlib.nullcontext()

    def kv_cache_budget_bytes(self, memory_fraction: float, cpu_kv_bytes: int | None = None) -> int:
        """Bytes the KV pool may take: ``memory_fraction`` of free device memory.

        Accelerator backends also cap the process at that fraction.  The CPU
        backend overrides this with an explicit byte budget.
        """
        if not 0.0 < memory_fraction <= 1.0:
            raise ValueError(f"memory_fraction must be in (0, 1], got {memory_fraction}")
        return int(self.memory_stats().free_bytes * memory_fraction)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} device={self.device} native_ops={self.ops.native_ops()}>"
