"""What the CUDA and NPU backends share: torch's per-device module (torch.cuda / torch.npu).

torch_npu mirrors torch.cuda's API (mem_get_info, memory_reserved, memory_allocated,
empty_cache, Stream, stream, synchronize), so one implementation serves both; each
subclass says which module to use and where its op overrides come from.
"""
from __future__ import annotations

import contextlib
import logging
from abc import abstractmethod
from types import ModuleType
from typing import Any, ContextManager

import torch

from hyspec.backend import Backend, MemoryStats
from hyspec.backends.optable import resolve_ops

log = logging.getLogger(__name__)

# Stream priorities: lower is more urgent.  0 is the default and the lowest;
# out-of-range values are clamped by the runtime, so -1 is "higher" everywhere.
STREAM_PRIORITY = {"high": -1, "low": 0}


class AcceleratorBackend(Backend):
    """A backend on ``torch.<device_type>``; nothing touches the device until first used."""

    device_type: str = "abstract"
    ops_module: str = ""
    ops_function: str = ""
    ops_source: str = ""

    def __init__(self, capabilities: Any, device_index: int = 0):
        if isinstance(device_index, bool) or not isinstance(device_index, int) or device_index < 0:
            raise ValueError(f"device_index must be a non-negative int, got {device_index!r}")
        count = getattr(capabilities, "device_count", None)
        if count is not None and device_index >= count:
            raise ValueError(f"{self.device_type}:{device_index} does not exist: {count} device(s) visible")
        resolved = resolve_ops(self.ops_module, self.ops_function, source=self.ops_source)
        super().__init__(torch.device(self.device_type, device_index), capabilities, resolved.table)
        self.ops_note = resolved.note
        self._streams: dict[str, Any] = {}

    @abstractmethod
    def device_module(self) -> ModuleType:
        """torch.cuda or torch.npu (imported lazily)."""

    def memory_stats(self) -> MemoryStats:
        """Total and free device memory; free counts what this process's caching allocator holds unused.

        ``mem_get_info`` reports memory torch has cached for reuse (a closed engine's KV pool, say) as in
        use, so a second engine in the same process would see almost nothing free; that memory is this
        process's to reuse, so it is added back.
        """
        module = self.device_module()
        free, total = module.mem_get_info(self.device)
        reusable = 0
        if hasattr(module, "memory_reserved") and hasattr(module, "memory_allocated"):
            reusable = max(int(module.memory_reserved(self.device)) - int(module.memory_allocated(self.device)), 0)
        return MemoryStats(total_bytes=int(total), free_bytes=min(int(free) + reusable, int(total)))

    def kv_cache_budget_bytes(self, memory_fraction: float, cpu_kv_bytes: int | None = None) -> int:
        """``memory_fraction`` of free device memory (measured after the weights are loaded).

        No process-wide cap is set (``set_per_process_memory_fraction``): one process may hold several
        engines (a benchmark, a test, a judge beside the engine under test), and a cap set by each would
        let the last one starve the others; the remaining ``1 - memory_fraction`` is the headroom for
        activations and captured graphs.  ``cpu_kv_bytes`` is for the CPU backend and is ignored here.
        """
        if not 0.0 < memory_fraction <= 1.0:
            raise ValueError(f"memory_fraction must be in (0, 1], got {memory_fraction}")
        return int(self.memory_stats().free_bytes * memory_fraction)

    def release_cached_memory(self) -> None:
        """Return the caching allocator's unused blocks to the device (after an engine closed)."""
        module = self.device_module()
        if hasattr(module, "empty_cache"):
            module.empty_cache()

    def synchronize(self) -> None:
        self.device_module().synchronize(self.device)

    def stream(self, priority: str = "normal") -> ContextManager[None]:
        """Target work on 'high', draft work on 'low'; 'normal' stays on the current stream."""
        if priority not in ("high", "normal", "low"):
            raise ValueError(f"stream priority must be 'high', 'normal' or 'low', not {priority!r}")
        if priority == "normal":
            return contextlib.nullcontext()
        module = self.device_module()
        if priority not in self._streams:  # one stream per priority, made on first use
            self._streams[priority] = module.Stream(device=self.device, priority=STREAM_PRIORITY[priority])
        return module.stream(self._streams[priority])
