"""Tiny FP8 checkpoints in the layouts FP8 models are published in, written from a random HF model."""
from __future__ import annotations

import json
from pathlib import Path

import torch

FP8_MAX = 448.0  # largest finite float8_e4m3fn
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def quantize_fp8(w: torch.Tensor, layout: str, block: tuple[int, int] = (32, 32)) -> tuple[torch.Tensor, torch.Tensor]:
    """``(fp8 weight, scale)`` with ``weight ~= fp8 * scale``: per ``"block"`` (edge blocks partial), ``"tensor"``
    or ``"channel"`` -- the amax / 448 rule every FP8 exporter uses."""
    w = w.float()
    rows, cols = w.shape
    if layout == "tensor":
        scale = (w.abs().max() / FP8_MAX).reshape(1)
        return (w / scale).to(torch.float8_e4m3fn), scale
    if layout == "channel":
        scale = w.abs().amax(dim=1, keepdim=True) / FP8_MAX  # [rows, 1]
        return (w / scale).to(torch.float8_e4m3fn), scale
    b0, b1 = block
    grid = (-(-rows // b0), -(-cols // b1))
    scale = torch.empty(grid)
    q = torch.empty(rows, cols, dtype=torch.float8_e4m3fn)
    for i in range(grid[0]):
        for j in range(grid[1]):
            tile = w[i * b0:(i + 1) * b0, j * b1:(j + 1) * b1]
            scale[i, j] = tile.abs().max() / FP8_MAX
            q[i * b0:(i + 1) * b0, j * b1:(j + 1) * b1] = (tile / scale[i, j]).to(torch.float8_e4m3fn)
    return q, scale


def write_fp8_checkpoint(src: Path, dst: Path, layout: str, block: tuple[int, int] = (32, 32)) -> None:
    """Copy the HF checkpoint in ``src`` to ``dst`` with every decoder projection in FP8.

    ``layout``: ``"block"`` -- DeepSeek-V3 / Qwen3-FP8 (``weight_scale_inv`` per block, ``quant_method: fp8``
    with ``weight_block_size``); ``"tensor"`` -- vLLM / AutoFP8 (``weight_scale`` scalar and ``input_scale``,
    ``quant_method: fp8``); ``"channel"`` -- llm-compressor's compressed-tensors FP8 (``weight_scale [rows, 1]``).
    """
    from safetensors.torch import load_file, save_file

    dst.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for file in sorted(src.glob("*.safetensors")):
        tensors.update(load_file(str(file)))
    out = {}
    for name, t in tensors.items():
        module = name.rsplit(".", 1)[0]
        if name.endswith(".weight") and module.rsplit(".", 1)[-1] in PROJECTIONS:
            q, scale = quantize_fp8(t, layout, block)
            out[name] = q
            if layout == "block":
                out[module + ".weight_scale_inv"] = scale
            else:
                out[module + ".weight_scale"] = scale
                if layout == "tensor":
                    out[module + ".input_scale"] = torch.tensor([0.05])
        else:
            out[name] = t
    save_file(out, str(dst / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((src / "config.json").read_text())
    if layout == "block":
        cfg["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                      "weight_block_size": list(block)}
    elif layout == "tensor":
        cfg["quantization_config"] = {"quant_method": "fp8", "activation_scheme": "static"}
    else:
        cfg["quantization_config"] = {
            "quant_method": "compressed-tensors", "format": "float-quantized", "ignore": ["lm_head"],
            "config_groups": {"group_0": {"targets": ["Linear"],
                                          "weights": {"num_bits": 8, "type": "float", "strategy": "channel",
                                                      "symmetric": True, "dynamic": False},
                                          "input_activations": {"num_bits": 8, "type": "float",
                                                                "strategy": "token", "dynamic": True}}}}
    (dst / "config.json").write_text(json.dumps(cfg))
    for extra in ("generation_config.json",):
        if (src / extra).is_file():
            (dst / extra).write_text((src / extra).read_text())
