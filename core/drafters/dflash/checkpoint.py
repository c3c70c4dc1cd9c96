"""DFlash / DSpark drafter directories: ``config.json`` + ``model.safetensors``.

``config.json`` is a Llama-family config of the draft layers (the target's
architecture and RoPE, ``num_hidden_layers`` = draft layers) plus::

    "hyspec_drafter": {"method": "dflash" | "dspark", "target_layers": [...], "block_size": K,
                       "target": {"hidden_size": ..., "vocab_size": ..., "num_hidden_layers": ...},
                       ...method-specific keys (DSpark: markov_rank, cut_threshold)}

``model.safetensors`` holds the drafter's own tensors under its module names
(``fc.weight``, ``hidden_norm.weight``, ``mask_embedding``, ``layers.{i}.*``,
``norm.weight``, DSpark's ``decoder.*``); the target's embedding and lm_head
are not stored.  ``config.json`` is written last, so a directory without it
is an unfinished write.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

from hyspec.drafters.checkpoint_io import (CONFIG_FILE, STORAGE, StoredTensors, read_config_json, save_checkpoint,
                                           stored_tensors)
from hyspec.drafters.dflash import published
from hyspec.drafters.dflash.model import DFlashConfig
from hyspec.errors import CheckpointError
from hyspec.model.config import ModelConfig
from hyspec.model.weights import SafetensorsCheckpoint, check_shape

HYSPEC_KEY = "hyspec_drafter"
_LAYER_KEYS = ("model_type", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
               "num_attention_heads", "num_key_value_heads", "head_dim", "rms_norm_eps", "max_position_embeddings")


def read_drafter_config(path: str | Path, method: str,
                        target: ModelConfig | None = None) -> tuple[DFlashConfig, dict[str, Any]]:
    """``(config, the hyspec_drafter section)`` of a ``method`` drafter directory; a z-lab DFlash directory
    (``dflash_config``) gives an equivalent section (:mod:`hyspec.drafters.dflash.published`)."""
    path = Path(path)
    data = read_config_json(path, f"{method} drafter")
    file = path / CONFIG_FILE
    section = data.get(HYSPEC_KEY)
    if section is None and data.get("speculators_model_type") is not None:
        raise CheckpointError(f"{file} is a speculators {data['speculators_model_type']!r} checkpoint; hyspec reads "
                              "DFlash drafters in z-lab's layout (dflash_config) or its own (hyspec_drafter)")
    if section is None and method == "dflash" and published.is_zlab(data):
        return published.zlab_config(data, file, target)
    if not isinstance(section, dict):
        raise CheckpointError(f"{file} has no {HYSPEC_KEY!r} section: not a hyspec {method} drafter")
    if section.get("method") != method:
        raise CheckpointError(f"{path} holds a {section.get('method')!r} drafter, not a {method} drafter")
    try:
        config = DFlashConfig(layers=ModelConfig.from_dict(data),
                              target_layers=tuple(int(x) for x in section["target_layers"]),
                              block_size=int(section["block_size"]))
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"{file}: bad or missing {HYSPEC_KEY} key ({exc!r})") from None
    return config, section


def config_dict(method: str, config: DFlashConfig, target: ModelConfig, extra: dict[str, Any]) -> dict[str, Any]:
    layers = config.layers
    data = dict(layers.raw) if layers.raw else {}
    data.update({key: getattr(layers, key) for key in _LAYER_KEYS})
    data.pop("num_nextn_predict_layers", None)
    data[HYSPEC_KEY] = {"method": method, "target_layers": list(config.target_layers), "block_size": config.block_size,
                        "target": {"hidden_size": target.hidden_size, "vocab_size": target.vocab_size,
                                   "num_hidden_layers": target.num_hidden_layers}, **extra}
    return data


def save_drafter(drafter: nn.Module, method: str, config: DFlashConfig, target: ModelConfig, out_dir: str | Path,
                 extra: dict[str, Any] | None = None, storage: str | None = None) -> None:
    """``storage`` None keeps the trained dtype; bfloat16 halves the file, int8 (per row) quarters its matrices
    (the loader dequantizes and casts to the serving dtype): what keeps the default model's block drafters
    inside the assets' budget.  Verification keeps the output exact whatever the stored precision."""
    if storage is not None and storage not in STORAGE:
        raise CheckpointError(f"{method} storage must be one of {', '.join(STORAGE)}, got {storage!r}")
    save_checkpoint(out_dir, stored_tensors(drafter.state_dict(), storage),
                    config_dict(method, config, target, extra or {}))


def load_drafter(
    path: str | Path,
    method: str,
    target: ModelConfig,
    build: Callable[[DFlashConfig, dict[str, Any]], nn.Module],  # (config, hyspec section) -> module on CPU
    dtype: torch.dtype,
    device: torch.device | str = "cpu",
) -> nn.Module:
    """Read, check against the target and fill a drafter; every mismatch names the key or tensor."""
    path = Path(path)
    config, section = read_drafter_config(path, method, target)
    config.check_target(target, str(path))
    drafter = build(config, section)
    ckpt = StoredTensors(path)  # int8-stored matrices come back dequantized
    expected = drafter.state_dict()
    if section.get(published.LAYOUT_KEY) == published.ZLAB:
        mask = drafter.shared["embed"][section["mask_token_id"]].detach().to("cpu", torch.float32)
        state = published.zlab_state(ckpt.names(), ckpt.get, expected, mask)
        state = {name: check_shape(name, t, expected[name].shape).to(dtype) for name, t in state.items()}
        drafter.load_state_dict(state, strict=True)
        return drafter.to(device=device, dtype=dtype).eval().requires_grad_(False)
    missing = [name for name in expected if name not in ckpt]
    if missing:
        raise CheckpointError(f"the {method} checkpoint in {path} lacks tensors {missing[:4]} "
                              f"({len(missing)} missing): it is corrupt or for another drafter configuration")
    unexpected = [name for name in ckpt.names() if name not in expected]
    if unexpected:
        raise CheckpointError(f"the {method} checkpoint in {path} has unknown tensors {unexpected[:4]}")
    state = {name: check_shape(name, ckpt.get(name), ref.shape).to(dtype) for name, ref in expected.items()}
    drafter.load_state_dict(state, strict=True)
    return drafter.to(device=device, dtype=dtype).eval().requires_grad_(False)
