"""What a safetensors checkpoint says about its own quantization (``config.json``'s ``quantization_config``).

FP8 checkpoints are read and their scales applied at load: every FP8 weight is multiplied by its
scale in fp32 and then cast to the compute dtype (``dequantize_fp8``).  The formats read:

* ``quant_method: "fp8"`` with ``weight_block_size`` (DeepSeek-V3, Qwen3-FP8): ``<name>.weight_scale_inv``
  of shape ``[ceil(rows / b0), ceil(cols / b1)]``, one fp32 multiplier per block; the last block of a
  row or column may be partial (DeepSeek-V3 ``inference/kernel.py`` ``weight_dequant``, commit
  d4c8543184d00ceb7a5ac6aa3ab995a8ca5ca84a: ``y = x * s`` with masked edge blocks).
* ``quant_method: "fp8"`` without a block size (vLLM's / AutoFP8's layout): ``<name>.weight_scale``,
  a scalar per tensor; an ``input_scale`` (the static activation scale) beside it.
* ``quant_method: "compressed-tensors"`` with ``format: "float-quantized"`` and 8-bit float weights
  (llm-compressor's FP8): ``<name>.weight_scale`` per tensor ``[1]``, per channel ``[rows, 1]`` or per
  block.

Why dequantize rather than keep FP8: no backend here has an FP8 matmul (the CPU has none at all), and
the activations of these formats are quantized per token at run time by the FP8 kernels; computing in
the dequantized weights is what transformers does without an FP8 GPU (``FineGrainedFP8Config``'s
``dequantize``), so activation scales (``input_scale``) are read and not applied.  The cost is memory: a
bf16 copy is twice the FP8 bytes.

Every other ``quant_method`` (GPTQ, AWQ, bitsandbytes, integer compressed-tensors, ...) is refused by
name with what to use instead, before any tensor is read: loading the packed integer tensors as if they
were weights would fail on a missing ``q_proj.weight`` at best.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from hyspec.errors import CheckpointError

#: dtypes an FP8 weight may be stored in
FP8_DTYPES = tuple(getattr(torch, n) for n in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz")
                   if hasattr(torch, n))

#: what a user with a checkpoint of one of these methods can do instead
_ADVICE = ("hyspec runs FP8 safetensors (block, tensor or channel scales), unquantized safetensors and GGUF files; "
           "use the model's unquantized (bf16) release, or a GGUF of it (llama.cpp's convert_hf_to_gguf.py, then "
           "llama-quantize to Q4_0 / Q8_0) for quantized CPU weights, or load the unquantized weights with "
           "quantization='int4' / 'int8'")
_KNOWN_METHODS = {
    "gptq": "GPTQ (packed integer weights qweight / qzeros / scales)",
    "awq": "AWQ (packed integer weights qweight / qzeros / scales)",
    "bitsandbytes": "bitsandbytes (4/8-bit integer weights)",
    "gguf": "GGUF inside safetensors",
    "hqq": "HQQ",
    "eetq": "EETQ (int8)",
    "aqlm": "AQLM (additive codebooks)",
    "quanto": "quanto",
    "torchao": "torchao",
    "exl2": "ExLlamaV2",
    "marlin": "Marlin (packed int4)",
    "mxfp4": "MXFP4",
    "fbgemm_fp8": "FBGEMM FP8 (per-row activation quantization)",
    "modelopt": "NVIDIA ModelOpt",
}


@dataclass(frozen=True)
class WeightScales:
    """How a checkpoint's FP8 weights find their scales."""

    method: str  # the quant_method as the config spells it
    scale_suffix: str  # "weight_scale_inv" or "weight_scale": <module>.<suffix> beside <module>.weight
    block_size: tuple[int, int] | None  # (rows, cols) of one scale's block; None: per tensor or per channel

    def scale_name(self, weight_name: str) -> str | None:
        """``...q_proj.weight`` -> ``...q_proj.weight_scale_inv`` (None for names that are not weights)."""
        if not weight_name.endswith(".weight"):
            return None
        return weight_name[: -len("weight")] + self.scale_suffix

    def is_scale(self, name: str) -> bool:
        """Tensors that describe weights rather than being weights: consumed by the dequantization."""
        return name.endswith(("." + self.scale_suffix, ".input_scale", ".weight_scale", ".weight_scale_inv",
                              ".input_scale_inv", ".k_scale", ".v_scale"))


def read_weight_scales(config: dict[str, Any], where: str) -> WeightScales | None:
    """The checkpoint's FP8 scale layout, None for an unquantized checkpoint; refuses every other method."""
    qc = config.get("quantization_config")
    if not qc:
        return None
    if not isinstance(qc, dict):
        raise CheckpointError(f"{where}: quantization_config must be an object, got {type(qc).__name__}")
    method = str(qc.get("quant_method", "")).lower()
    if method == "fp8":
        return _fp8(qc, where)
    if method == "compressed-tensors":
        return _compressed_tensors(qc, where)
    what = _KNOWN_METHODS.get(method, f"quant_method {method!r}" if method else "a quantization_config without quant_method")
    raise CheckpointError(f"{where}: the checkpoint is quantized with {what}, which hyspec does not run; {_ADVICE}")


def _fp8(qc: dict[str, Any], where: str) -> WeightScales:
    fmt = str(qc.get("fmt", "e4m3")).lower()
    if fmt != "e4m3":
        raise CheckpointError(f"{where}: FP8 format {fmt!r} is not supported (only e4m3); {_ADVICE}")
    block = qc.get("weight_block_size")
    if block is None:
        return WeightScales("fp8", "weight_scale", None)
    return WeightScales("fp8", "weight_scale_inv", _block_size(block, where))


def _compressed_tensors(qc: dict[str, Any], where: str) -> WeightScales:
    fmt = qc.get("format")
    groups = qc.get("config_groups") or {}
    if fmt != "float-quantized" or not groups:
        raise CheckpointError(f"{where}: compressed-tensors format {fmt!r} is not supported (only FP8 weights, "
                              f"format 'float-quantized'); {_ADVICE}")
    blocks = set()
    for name, group in groups.items():
        weights = (group or {}).get("weights") or {}
        kind, bits, strategy = weights.get("type"), weights.get("num_bits"), weights.get("strategy")
        if kind != "float" or bits != 8 or strategy not in ("tensor", "channel", "block"):
            raise CheckpointError(
                f"{where}: compressed-tensors group {name!r} stores {bits}-bit {kind} weights with strategy "
                f"{strategy!r}; hyspec runs only 8-bit float weights per tensor, channel or block; {_ADVICE}")
        if strategy == "block":
            blocks.add(_block_size(weights.get("block_structure"), where))
    if len(blocks) > 1:
        raise CheckpointError(f"{where}: compressed-tensors groups use different block sizes {sorted(blocks)}")
    return WeightScales("compressed-tensors", "weight_scale", blocks.pop() if blocks else None)


def _block_size(value: Any, where: str) -> tuple[int, int]:
    if not (isinstance(value, (list, tuple)) and len(value) == 2 and all(isinstance(v, int) and v > 0 for v in value)):
        raise CheckpointError(f"{where}: FP8 weight block size {value!r} is not two positive integers")
    return int(value[0]), int(value[1])


def checkpoint_config(path: Path) -> dict[str, Any]:
    """``path/config.json`` as a dict, or {} where there is none (a bare tensor folder)."""
    file = path / "config.json"
    if not file.is_file():
        return {}
    try:
        data = json.loads(file.read_text())
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{file} is not valid JSON: {exc}") from None
    return data if isinstance(data, dict) else {}


def dequantize_fp8(
    weight: torch.Tensor,  # [rows, cols] FP8
    scale: torch.Tensor,  # [] / [1] per tensor, [rows] / [rows, 1] per channel, [ceil(rows/b0), ceil(cols/b1)] per block
    block_size: tuple[int, int] | None,
    name: str,
) -> torch.Tensor:  # [rows, cols] fp32
    """``weight * scale`` in fp32, the scale broadcast over its tensor, row or block."""
    if weight.dim() != 2:
        raise CheckpointError(f"FP8 tensor {name!r} has {weight.dim()} dimensions; only matrices are supported")
    rows, cols = weight.shape
    values = weight.to(torch.float32)
    s = scale.to(torch.float32)
    if s.numel() == 1:
        return values * s.reshape(())
    if block_size is None:
        if s.numel() == rows and s.shape in ((rows,), (rows, 1)):
            return values * s.reshape(rows, 1)
        raise CheckpointError(f"scale of FP8 tensor {name!r} has shape {tuple(s.shape)}: neither per tensor nor per "
                              f"channel of a {rows}x{cols} weight, and the config gives no block size")
    b0, b1 = block_size
    grid = (-(-rows // b0), -(-cols // b1))
    if tuple(s.shape) != grid:
        raise CheckpointError(f"scale of FP8 tensor {name!r} has shape {tuple(s.shape)}; {b0}x{b1} blocks of a "
                              f"{rows}x{cols} weight need {grid}")
    # Expand the scales over rows only and broadcast them over each column block in place (a per-element
    # scale tensor would be a second weight-sized allocation); the last, partial block is cropped.
    per_row = s.repeat_interleave(b0, dim=0)[:rows]  # [rows, grid[1]]
    full = cols // b1
    values[:, : full * b1].view(rows, full, b1).mul_(per_row[:, :full, None])
    if cols % b1:
        values[:, full * b1:].mul_(per_row[:, full:])
    return values
