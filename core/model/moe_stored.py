"""A quantized GGUF's routed experts computed as the file stores them, not dequantized at load.

Why: dequantized to fp32, the experts of a real MoE GGUF take ~7x the file (Qwen3-30B-A3B Q4_K_M: 18 GB on
disk, ~120 GB as fp32 stacks).  Kept as blocks, a loaded model is about the size of its file.

How: each expert's gate|up and down matrices (and Qwen2-MoE's shared expert's) become the backend's quantized
linears (``Backend.quantized_linear``, what hyspec.model.quantize_model gives the dense projections) over that
expert's rows of the stacked ``ffn_*_exps`` tensors (hyspec.model.gguf_moe.ExpertSlice: the file's blocks,
copied once, never dequantized).  On the CPU backend in fp32 that is hyspec's block kernel (cpu_ops/qgemm.c:
exact weights, fp32 sums in a fixed order per output row), so an expert's output for a token does not depend
on how many tokens share that expert in a step, and verifying n tokens gives the logits of n single steps.
The router (``ffn_gate_inp``, F32 in every llama.cpp file) and Qwen2-MoE's shared-expert gate stay dense.

A layer stays dense (today's path, one report line saying why) when the backend has no kernel for one of its
matrices (F16 / F32 experts; the CPU's K-quant kernel runs fp32 activations only), or its gate and up are
stored in types that do not join.  Only the default ``quantization`` (None: the checkpoint's own) keeps
experts as stored; ``"none"`` is the dense reference, and the int4 / int8 / a8 modes refuse MoE models
(hyspec.model.quantize_model).
"""
from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from torch import nn

from hyspec.errors import CheckpointError
from hyspec.model.config import ModelConfig
from hyspec.model.moe import SparseMoE, expert_weight_names, shared_expert_weight_names
from hyspec.model.quant import GGUF_GROUP_TYPES, GGUF_STORED_TYPES, concat_rows

if TYPE_CHECKING:
    from hyspec.backend import Backend
    from hyspec.model.llama import CausalLM
    from hyspec.model.quantize_model import QuantizationReport

log = logging.getLogger(__name__)

_BLOCK_TYPES = set(GGUF_GROUP_TYPES) | set(GGUF_STORED_TYPES)


@dataclass
class _Layer:
    gate_up: list[nn.Module]  # per expert
    down: list[nn.Module]
    shared: tuple[nn.Module, nn.Module] | None  # Qwen2-MoE's shared expert (gate|up, down)


@dataclass
class StoredExperts:
    """Which routed layers keep their experts as stored, their modules, and what to report."""

    layers: dict[int, _Layer] = field(default_factory=dict)
    linears: Counter = field(default_factory=Counter)  # ``expert int4 (Q4_K)`` -> modules
    kernels: Counter = field(default_factory=Counter)
    fallbacks: list[str] = field(default_factory=list)

    def attach(self, model: CausalLM) -> None:
        """Give each planned layer's routed block its modules (the block may still be on the meta device)."""
        for i, layer in self.layers.items():
            block = model.layers[i].mlp
            if not isinstance(block, SparseMoE):
                raise TypeError(f"layer {i} has no routed block to keep experts as stored in")
            block.use_stored_experts(layer.gate_up, layer.down)
            if layer.shared is not None:
                block.shared_expert.gate_up_proj, block.shared_expert.down_proj = layer.shared

    def report_into(self, report: QuantizationReport) -> None:
        report.linears.update(self.linears)
        report.kernels.update(self.kernels)
        report.fallbacks.extend(self.fallbacks)


def plan_stored_experts(cfg: ModelConfig, ckpt, backend: Backend | None, quantization: str | None,
                        dtype: torch.dtype) -> StoredExperts:
    """The routed layers whose experts ``backend`` computes as ``ckpt`` stores them, with their modules built.

    Empty (every layer dense) without a backend, for a quantization other than the default, or for a
    checkpoint without quantized blocks (safetensors)."""
    plan = StoredExperts()
    if cfg.moe is None or backend is None or quantization is not None or not hasattr(ckpt, "group_quantized"):
        return plan
    dense: dict[str, list[int]] = {}  # why -> the layers it keeps dense
    for i in range(cfg.num_hidden_layers):
        if not cfg.moe.is_sparse(i):
            continue
        layer = _stored_layer(cfg, ckpt, backend, dtype, f"model.layers.{i}.", plan)
        if isinstance(layer, str):
            dense.setdefault(layer, []).append(i)
        else:
            plan.layers[i] = layer
    for why, layers in dense.items():
        plan.fallbacks.append(f"experts of layer{'s' if len(layers) > 1 else ''} {', '.join(map(str, layers))} "
                              f"stay dense: {why}")
        log.info("%s", plan.fallbacks[-1])
    return plan


def _stored_layer(cfg: ModelConfig, ckpt, backend: Backend, dtype: torch.dtype, src: str,
                  plan: StoredExperts) -> _Layer | str:
    """The layer's modules, or why it stays dense.  Counts go into ``plan`` only for a layer that is kept."""
    H, I = cfg.hidden_size, cfg.moe.expert_intermediate_size
    S = cfg.moe.shared_expert_intermediate_size
    experts = expert_weight_names(cfg, src)
    shared = shared_expert_weight_names(cfg, src) if S else None
    every = [n for names in experts + ([shared] if shared else []) for n in names]
    types = sorted({ckpt.tensor_type(n) for n in every})
    unkept = [t for t in types if t not in _BLOCK_TYPES]
    if unkept:
        return f"stored as {'+'.join(unkept)}, which hyspec computes dequantized"
    linears: Counter = Counter()
    kernels: Counter = Counter()

    def module(names: tuple[str, ...], rows: int, cols: int) -> nn.Module | str:
        for name in names:
            if ckpt.shape(name) != (rows, cols):
                raise CheckpointError(f"{name} has shape {list(ckpt.shape(name))}, expected {[rows, cols]}")
        w = concat_rows([ckpt.group_quantized(n) for n in names])
        if w is None:
            return f"{' and '.join(names)} are stored as {'+'.join(ckpt.tensor_type(n) for n in names)}, " \
                   "which do not join into one matrix"
        linear = backend.quantized_linear(w, None, dtype)
        if linear is None:
            return f"the {backend.name} backend has no kernel for {w.source} blocks with {dtype} activations"
        linears[f"expert int{w.bits} ({w.source})"] += 1
        kernels[getattr(linear, "kernel", type(linear).__name__)] += 1
        return linear

    gate_up, down = [], []
    for gate, up, d in experts:
        made = module((gate, up), I, H), module((d,), H, I)
        reason = next((m for m in made if isinstance(m, str)), None)
        if reason is not None:
            return reason
        gate_up.append(made[0])
        down.append(made[1])
    shared_modules = None
    if shared is not None:
        shared_modules = module(shared[:2], S, H), module(shared[2:], H, S)
        reason = next((m for m in shared_modules if isinstance(m, str)), None)
        if reason is not None:
            return f"shared expert: {reason}"
    plan.linears.update(linears)
    plan.kernels.update(kernels)
    return _Layer(gate_up, down, shared_modules)


__all__ = ["StoredExperts", "plan_stored_experts"]
