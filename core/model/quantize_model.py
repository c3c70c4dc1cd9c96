"""Put quantized weights into a loaded model where the backend has kernels for them.

``quantization`` (vLLM's argument name) says what is asked:

* ``None`` (the default) -- the checkpoint's own quantization: a GGUF's Q4_0 /
  Q4_1 / Q8_0 tensors stay as their codes, and its Q5_0 / Q5_1 / K-quant ones
  as their blocks, wherever the backend computes with them; a tensor of another type, or one the backend has no kernel for, is
  dequantized, and one log line names each such type.  Safetensors
  checkpoints stay dense.  The activation dtype picks the kernel (the CPU:
  torch's bf16 kernels for bf16, hyspec's exact fp32 kernel for float32).
* ``"none"`` -- dequantize everything (the reference numerics).
* ``"int4"`` -- every decoder linear in group-wise int4 (a GGUF's Q4 codes as
  they are, anything else quantized here, group 32), the lm_head in int8 (as
  llama.cpp's Q4 files keep the output matrix at 8 bits or more).
* ``"int8"`` -- every linear and the lm_head in per-row int8.
* ``"a8"`` -- a GGUF's own blocks (Q4_0 / Q4_1 / Q8_0 / Q5_0 / Q5_1 / Q4_K / Q5_K / Q6_K, as ``None``)
  times activations rounded to 8 bits per 32-element block: llama.cpp's arithmetic, integer dot
  products (the CPU backend's qgemm_a8, AVX-512 VNNI).  Plain decoding and verification still agree
  bit for bit; against the fp32 reference the logits move by the activations' rounding.  A matrix (or
  the rows of a fused one) stored in a block type that kernel would not take keeps fp32 activations on
  the exact block kernel, and the report lists them (every type the block kernel takes has the 8-bit
  one today).  Any other matrix without the kernel (dense weights, no VNNI, bf16 activations) is an
  error.

A demanded kind (``int4`` / ``int8``) the backend cannot compute with is an
error naming the backend; the default falls back to dense weights instead.

The backend side is two methods of :class:`hyspec.backend.Backend`:
``quantized_linear(w, bias, dtype, activations)`` (a module for activations of ``dtype``, or None: no
kernel; ``int8_activations_refusal`` says why for ``"a8"``) and
``quantized_head(weight, w, dtype)`` (registers a quantized stand-in for the
lm_head matmul and returns it, or None).  This module stays vendor-neutral.
"""
from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from torch import nn

from hyspec.errors import ConfigError
from hyspec.model.quant import GroupQuantized, concat_rows, quantize

if TYPE_CHECKING:
    from hyspec.backend import Backend
    from hyspec.model.llama import CausalLM

log = logging.getLogger(__name__)

QUANTIZATION_CHOICES = ("none", "int4", "int8", "a8")
#: the stored types quantization="a8" multiplies by 8-bit activations (cpu_ops/qgemm_a8.py's A8_BLOCK_TYPES)
A8_TYPES = "Q4_0 / Q4_1 / Q8_0 / Q5_0 / Q5_1 / Q4_K / Q5_K / Q6_K"


@dataclass
class QuantizationReport:
    """What the pass did: modules per kind (``int4 (Q4_1)``, ``dense``) and why anything stayed dense."""

    mode: str | None
    linears: Counter = field(default_factory=Counter)
    kernels: Counter = field(default_factory=Counter)  # the backend's kernel per quantized linear (its ``kernel``)
    head: str = "dense"
    head_bytes: int = 0  # what a quantized lm_head reads per use (0: the dense matrix is read)
    fallbacks: list[str] = field(default_factory=list)

    def summary(self) -> str:
        parts = [f"{n} {kind}" for kind, n in sorted(self.linears.items())]
        kernels = f" [{', '.join(sorted(self.kernels))}]" if self.kernels else ""
        return f"linears: {', '.join(parts) or 'none'}{kernels}; lm_head: {self.head}"

    def to_dict(self) -> dict:
        return {"mode": self.mode, "linears": dict(self.linears), "kernels": dict(self.kernels), "lm_head": self.head,
                "lm_head_bytes": self.head_bytes, "fallbacks": self.fallbacks}


def check_quantization(quantization: str | None) -> str | None:
    if quantization is not None and quantization not in QUANTIZATION_CHOICES:
        raise ConfigError("quantization", f"unknown quantization {quantization!r}; choose one of "
                                          f"{', '.join(QUANTIZATION_CHOICES)} (or leave it unset: the checkpoint's own)")
    return quantization


def _sources(model: "CausalLM") -> list[tuple[str, list[str], nn.Module]]:
    """(module path, checkpoint tensor names it fuses, the module) for every decoder linear."""
    out = []
    fused = model.config.model_type == "phi3"  # Phi-3 stores qkv_proj and gate_up_proj fused, as hyspec runs them
    for i, layer in enumerate(model.layers):
        a, m = f"model.layers.{i}.self_attn.", f"model.layers.{i}.mlp."
        qkv = [a + "qkv_proj"] if fused else [a + "q_proj", a + "k_proj", a + "v_proj"]
        out.append((f"layers.{i}.self_attn.qkv_proj", qkv, layer.self_attn.qkv_proj))
        out.append((f"layers.{i}.self_attn.o_proj", [a + "o_proj"], layer.self_attn.o_proj))
        if not hasattr(layer.mlp, "gate_up_proj"):  # a routed block: its experts are hyspec.model.moe_stored's
            continue
        gate_up = [m + "gate_up_proj"] if fused else [m + "gate_proj", m + "up_proj"]
        out.append((f"layers.{i}.mlp.gate_up_proj", gate_up, layer.mlp.gate_up_proj))
        out.append((f"layers.{i}.mlp.down_proj", [m + "down_proj"], layer.mlp.down_proj))
    return out


def _stored(ckpt, names: list[str], bits: int | None) -> tuple[GroupQuantized | None, str]:
    """The fused matrix as the GGUF stores it (None: some part is not a group type / differs), and its types."""
    group = getattr(ckpt, "group_quantized", None)
    types = "+".join(sorted({ckpt.tensor_type(n + ".weight") for n in names})) if group else "dense"
    if group is None:
        return None, types
    parts = [group(n + ".weight") for n in names]
    # a demanded int4 / int8 needs codes torch's kernels take: blocks-only types (Q4_K ...) are requantized
    if any(p is None or (bits is not None and (p.bits != bits or p.q is None)) for p in parts):
        return None, types
    return concat_rows(parts), types


def quantize_model(model: "CausalLM", ckpt, quantization: str | None, backend: "Backend",
                   dtype: torch.dtype) -> QuantizationReport:
    """Swap the decoder's linears (and the lm_head's matmul) for the backend's quantized kernels, in place."""
    report = QuantizationReport(quantization)
    if quantization == "none" or (quantization is None and not hasattr(ckpt, "group_quantized")):
        report.linears["dense"] = len(_sources(model))
        return report
    routed = [i for i, layer in enumerate(model.layers) if not hasattr(layer.mlp, "gate_up_proj")]
    if routed and quantization in ("int4", "int8", "a8"):
        raise ConfigError("quantization", f"{quantization} is not implemented for the routed experts of this "
                                          f"{model.config.model_type} model (layers {routed[:4]}...): hyspec does "
                                          "not requantize MoE experts; leave quantization unset (a GGUF's experts "
                                          "then run as stored) or 'none'")
    demanded = {"int4": 4, "int8": 8}.get(quantization)
    activations = "int8" if quantization == "a8" else "native"
    if activations == "int8" and not hasattr(ckpt, "group_quantized"):
        raise ConfigError("quantization", f"a8 needs a GGUF checkpoint with {A8_TYPES} tensors")
    no_kernel: Counter = Counter()
    kept_fp32: Counter = Counter()  # a8: matrices in a type qgemm_a8 does not take, left on fp32 activations
    for path, names, module in _sources(model):
        w, types = _stored(ckpt, names, demanded)
        if w is None and demanded is not None:  # quantize here from the file's exact (dequantized) values
            dense = torch.cat([ckpt.get(n + ".weight").to(torch.float32) for n in names])
            w = quantize(dense, demanded)
        if w is None:
            if activations != "native":
                raise ConfigError("quantization", f"a8: {path} is stored as {types}, not a GGUF block type "
                                                  f"({A8_TYPES} run with 8-bit activations)")
            no_kernel[types] += 1
            report.linears["dense"] += 1
            continue
        replacement = backend.quantized_linear(w, module.bias, dtype, activations=activations)
        if replacement is None:
            if activations != "native":
                raise ConfigError("quantization", _a8_refusal(backend, dtype, f"{path} ({w.source})"))
            if demanded is not None:
                raise ConfigError("quantization", f"the {backend.name} backend has no {quantization} kernel for "
                                                  f"{path} ({w.shape[0]}x{w.shape[1]}, group {w.group_size})")
            no_kernel[w.source] += 1
            report.linears["dense"] += 1
            continue
        _set_submodule(model, path, replacement)
        if activations == "int8" and not getattr(replacement, "a8", False):
            parts = getattr(replacement, "parts", None)
            fp32 = sorted({p.block_type for p in parts if not p.a8}) if parts is not None else [w.source]
            kept_fp32[w.source, "/".join(fp32)] += 1
        report.linears[f"int{w.bits} ({w.source})"] += 1
        report.kernels[getattr(replacement, "kernel", type(replacement).__name__)] += 1
    for (source, fp32), n in kept_fp32.items():
        rows = "" if fp32 == source else f" for their {fp32} rows"
        msg = (f"a8: {n} linear(s) stored as {source} keep fp32 activations{rows} "
               f"(no 8-bit-activation kernel for {fp32})")
        report.fallbacks.append(msg)
        log.info(msg)
    for types, n in no_kernel.items():
        msg = f"{n} linear(s) stored as {types}: no {backend.name} kernel computes with them; dequantized"
        report.fallbacks.append(msg)
        log.info(msg)
    report.head = _quantize_head(model, ckpt, demanded, backend, report, dtype, activations)
    return report


def _a8_refusal(backend: "Backend", dtype: torch.dtype, what: str) -> str:
    why = backend.int8_activations_refusal(dtype)
    return f"the {backend.name} backend has no 8-bit-activation kernel for {what}" + (f": {why}" if why else "")


def _quantize_head(model: "CausalLM", ckpt, demanded: int | None, backend: "Backend",
                   report: QuantizationReport, dtype: torch.dtype, activations: str = "native") -> str:
    name = "model.embed_tokens.weight" if model.config.tie_word_embeddings else "lm_head.weight"
    w = ckpt.group_quantized(name) if hasattr(ckpt, "group_quantized") else None
    if demanded is not None and (w is None or w.bits != 8 or w.q is None):
        w = quantize(ckpt.get(name).to(torch.float32), 8)  # the head stays 8-bit even for int4 (see above)
    if w is None:
        if activations != "native":
            raise ConfigError("quantization", f"a8: the lm_head ({name}) is not stored as a GGUF block type")
        return "dense"
    head = backend.quantized_head(model.lm_head_weight, w, dtype, activations=activations)
    if head is None:
        if activations != "native":
            raise ConfigError("quantization", _a8_refusal(backend, dtype, "the lm_head"))
        if demanded is not None:
            raise ConfigError("quantization", f"the {backend.name} backend has no int{w.bits} kernel for the lm_head")
        msg = f"lm_head stored as {w.source}: no {backend.name} kernel computes with it; dequantized"
        report.fallbacks.append(msg)
        log.info(msg)
        return "dense"
    report.head_bytes = sum(b.numel() * b.element_size() for b in head.buffers())
    if activations != "native" and not getattr(head, "a8", False):
        msg = f"a8: the lm_head stored as {w.source} keeps fp32 activations (no 8-bit-activation kernel for {w.source})"
        report.fallbacks.append(msg)
        log.info(msg)
        return f"int{w.bits} ({w.source})"
    return f"int{w.bits} ({w.source})" + (", int8 activations" if activations != "native" else "")


def _set_submodule(model: nn.Module, path: str, module: nn.Module) -> None:
    parent_path, _, name = path.rpartition(".")
    setattr(model.get_submodule(parent_path), name, module)


__all__ = ["QUANTIZATION_CHOICES", "QuantizationReport", "check_quantization", "quantize_model"]
