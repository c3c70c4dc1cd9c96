"""The CPU backend: host memory, the reference ops plus hyspec.cpu_ops' fast paths.

Work on the CPU is synchronous, so there are no streams to order and
``synchronize`` has nothing to wait for (the base class's no-ops apply).
"""
from __future__ import annotations

import logging

import torch

from hyspec.backend import Backend, MemoryStats
from hyspec.backends.meminfo import host_memory
from hyspec.backends.optable import resolve_ops
from hyspec.backends.records import CpuCapabilities

log = logging.getLogger(__name__)

#: KV pool on the CPU when the user gives no byte budget (``cpu_kv_bytes``).
DEFAULT_CPU_KV_BYTES = 2 << 30


class CPUBackend(Backend):
    name = "cpu"

    def __init__(self, capabilities: CpuCapabilities):
        resolved = resolve_ops("hyspec.cpu_ops", "cpu_op_overrides", source="cpu_ops")
        super().__init__(torch.device("cpu"), capabilities, resolved.table)
        self.ops_note = resolved.note
        from hyspec.cpu_ops.packed_linear import invariant_kernel_available, packing_available

        dtypes = (("fp32", torch.float32), ("bf16", torch.bfloat16))
        invariant = [name for name, dt in dtypes if invariant_kernel_available(dt)]
        packed = [name for name, dt in dtypes if packing_available(dt) and not invariant_kernel_available(dt)]
        # The linear layers are swapped for PackedLinear modules (optimize_model); the lm-head matmul is
        # the op table's ``logits`` (hyspec.cpu_ops.cpu_op_overrides), served the same way.
        notes = []
        if invariant:
            from hyspec.cpu_ops.dense_gemm import isa

            notes.append(f"linear layers: hyspec dense_gemm ({'/'.join(invariant)}, {isa()}; batch-invariant)")
        if packed:
            notes.append(f"linear layers: weights packed once ({'/'.join(packed)}: oneDNN / MKL)")
        from hyspec.cpu_ops.decoder_stack import library as decoder_stack_library

        if decoder_stack_library() is not None:
            notes.append("decoder layers: one C call per forward where the weights allow (cpu_ops/decoder_stack.c)")
        for linear in notes:
            self.ops_note = linear if self.ops_note is None else f"{linear}; {self.ops_note}"

    def optimize_model(self, model: torch.nn.Module) -> torch.nn.Module:
        """Prepare linear weights once (hyspec's batch-invariant kernel, else oneDNN / MKL packing).

        Swaps ``nn.Linear`` modules for ``PackedLinear`` ones (same interface) and changes nothing else of
        the model; the logits matmul is packed through the op table instead.
        """
        try:
            from hyspec.cpu_ops.optimize import optimize_for_cpu
        except ImportError as exc:  # a trimmed install without cpu_ops: run the model as loaded
            log.info("CPU model optimisations unavailable (%s)", exc)
            return model
        return optimize_for_cpu(model)

    def quantization_kernels(self) -> tuple[str, ...]:
        try:
            from hyspec.cpu_ops.quantized_linear import int4_kernel_available, int8_kernel_available
        except ImportError:
            return ()
        from hyspec.cpu_ops.qgemm import library

        kinds = [kind for kind, ok in (("int4", int4_kernel_available()), ("int8", int8_kernel_available())) if ok]
        if library() is not None:
            # hyspec's exact kernel over Q4_0 .. Q8_0, Q5_0 / Q5_1 and K-quant blocks (cpu_ops/qgemm.c, kquants.c)
            kinds.append("gguf-blocks-fp32")
        from hyspec.cpu_ops.qgemm_a8 import available

        if available()[0]:
            kinds.append("gguf-blocks-a8")  # the same blocks times 8-bit activations (cpu_ops/qgemm_a8.c, VNNI)
        return tuple(kinds)

    def quantized_linear(self, w, bias, dtype, activations="native"):
        """fp32 activations: hyspec's exact kernel over the GGML blocks (cpu_ops/qgemm.c); bf16: torch's int4
        (group-wise) / int8 (per-row) kernels.  See hyspec.cpu_ops.quantized_linear."""
        try:
            from hyspec.cpu_ops.quantized_linear import quantized_linear
        except ImportError:
            return None
        return quantized_linear(w, bias, dtype, activations)

    def quantized_activation_dtype(self):
        """fp32 where hyspec's exact block kernel builds: the weights stay 4.5 / 8.5 bits either way, and on an
        AVX2 CPU the fp32 step measured as fast as torch's bf16 int4 one (20.1 vs 19.4 tok/s, SmolLM2)."""
        try:
            from hyspec.cpu_ops.qgemm import library
        except ImportError:
            return None
        return torch.float32 if library() is not None else None

    def int8_activations_refusal(self, dtype):
        if dtype != torch.float32:
            return f"its activations must be float32, not {dtype}"
        try:
            from hyspec.cpu_ops.qgemm_a8 import available
        except ImportError:
            return "hyspec.cpu_ops is not installed"
        ok, why = available()
        return None if ok else why

    def quantized_head(self, weight, w, dtype, activations="native"):
        """The ``logits`` op (hyspec.cpu_ops.packed_linear.packed_logits) multiplies by ``w``'s codes from now on."""
        try:
            from hyspec.cpu_ops.quantized_linear import QUANTIZED_HEADS, quantized_linear
        except ImportError:
            return None
        head = quantized_linear(w, None, dtype, activations) if "logits" in self.ops.native_ops() else None
        if head is not None:
            QUANTIZED_HEADS.register(weight, head)
        return head

    def memory_stats(self) -> MemoryStats:
        mem = host_memory()
        if mem is None:
            raise RuntimeError("host memory size is unknown: no /proc/meminfo and os.sysconf cannot tell")
        if mem.available_bytes is None:
            log.warning("available host memory is unknown on this OS; counting all %d bytes as free",
                        mem.total_bytes)
        free = mem.total_bytes if mem.available_bytes is None else mem.available_bytes
        return MemoryStats(total_bytes=mem.total_bytes, free_bytes=free)

    def kv_cache_budget_bytes(self, memory_fraction: float, cpu_kv_bytes: int | None = None) -> int:
        """``cpu_kv_bytes`` (default 2 GiB), capped at ``memory_fraction`` of available host memory.

        Host memory is shared with the model weights, the OS and other
        processes, so a fraction of *free* memory is only the upper bound; the
        explicit budget keeps a CPU box from being swapped to death.
        """
        if not 0.0 < memory_fraction <= 1.0:
            raise ValueError(f"memory_fraction must be in (0, 1], got {memory_fraction}")
        if cpu_kv_bytes is not None and (isinstance(cpu_kv_bytes, bool) or not isinstance(cpu_kv_bytes, int)
                                         or cpu_kv_bytes <= 0):
            raise ValueError(f"cpu_kv_bytes must be a positive number of bytes, got {cpu_kv_bytes!r}")
        budget = DEFAULT_CPU_KV_BYTES if cpu_kv_bytes is None else cpu_kv_bytes
        cap = int(self.memory_stats().free_bytes * memory_fraction)
        if budget > cap:
            # an explicit budget that cannot be met deserves a warning; the default one does not
            level = logging.WARNING if cpu_kv_bytes is not None else logging.INFO
            log.log(level, "CPU KV budget %d bytes capped to %d (%.0f%% of available host memory)",
                    budget, cap, memory_fraction * 100)
        return min(budget, cap)
