"""Drafter checkpoint directories on disk: one ``config.json`` reader, one writer (tensors first, config last).

Every drafter directory (DFlash / DSpark, EAGLE heads, MTP modules) is a
``config.json`` plus safetensors.  ``config.json`` is always written last and
atomically, so a directory that has it is complete and one without it is an
unfinished write; every reader fails with a :class:`CheckpointError` that
names the file.  Tensors are read back through
:class:`hyspec.model.weights.SafetensorsCheckpoint`.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from hyspec.errors import CheckpointError
from hyspec.model.weights import SafetensorsCheckpoint, write_safetensors_atomically

CONFIG_FILE = "config.json"
TENSORS_FILE = "model.safetensors"
#: storage dtypes a drafter's matrices may be saved in (``--option storage=...``)
STORAGE = ("float32", "bfloat16", "int8")
SCALE_SUFFIX = "_scale"  # int8 storage: ``W`` is int8 and ``W_scale`` [rows] fp32, W ~= W_int8 * W_scale[:, None]
INT8_MIN_NUMEL = 1 << 16  # smaller tensors (norms, biases) stay in bf16: int8 would save nothing worth the error


def read_config_json(path: str | Path, kind: str) -> dict[str, Any]:
    """``path/config.json`` as a dict; ``kind`` names the directory in errors (``"EAGLE head"``)."""
    path = Path(path)
    file = path / CONFIG_FILE
    if not path.is_dir():
        raise CheckpointError(f"{kind} directory {str(path)!r} does not exist")
    if not file.is_file():
        raise CheckpointError(f"{file} not found: the {kind} directory needs config.json "
                              "(a missing config.json also marks an unfinished write)")
    try:
        data = json.loads(file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{file} is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{file} must hold a JSON object")
    return data


def write_json_atomically(file: Path, data: dict[str, Any]) -> None:
    """``data`` as indented JSON, through a temporary name: an interrupted write never looks complete."""
    tmp = file.with_name(file.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    tmp.replace(file)


def stored_tensors(tensors: dict[str, torch.Tensor], storage: str | None) -> dict[str, torch.Tensor]:
    """``tensors`` as saved under ``storage``: None keeps their dtypes; ``float32``/``bfloat16`` cast floats;
    ``int8`` stores each large matrix as symmetric per-row int8 plus an fp32 ``<name>_scale`` (the rest in bf16).

    Storage only: a loader dequantizes (:class:`StoredTensors`), and speculative verification keeps the
    output exact whatever the drafter's weights are -- int8 can only cost acceptance, never correctness.
    """
    if storage is None:
        return dict(tensors)
    if storage not in STORAGE:
        raise CheckpointError(f"storage {storage!r} is not one of {', '.join(STORAGE)}")
    out: dict[str, torch.Tensor] = {}
    for name, t in tensors.items():
        if not t.is_floating_point():
            out[name] = t
        elif storage == "int8" and t.dim() == 2 and t.numel() >= INT8_MIN_NUMEL:
            w = t.detach().float()
            scale = (w.abs().amax(dim=1) / 127.0).clamp_min(torch.finfo(torch.float32).tiny)
            out[name] = torch.round(w / scale[:, None]).clamp_(-127, 127).to(torch.int8)
            out[name + SCALE_SUFFIX] = scale
        else:
            out[name] = t.to(torch.float32 if storage == "float32" else torch.bfloat16)
    return out


class StoredTensors:
    """A drafter's safetensors as floating tensors: int8-stored matrices come back dequantized (fp32),
    and their ``_scale`` companions are hidden from :meth:`names`."""

    def __init__(self, path: str | Path):
        self.ckpt = SafetensorsCheckpoint(path)
        every = set(self.ckpt.names())
        self._scaled = {n for n in every if n + SCALE_SUFFIX in every}
        self._names = sorted(n for n in every if not (n.endswith(SCALE_SUFFIX) and n[: -len(SCALE_SUFFIX)] in every))

    def names(self) -> list[str]:
        return list(self._names)

    def __contains__(self, name: str) -> bool:
        return name in self._names

    def shape(self, name: str) -> tuple[int, ...]:
        return self.ckpt.shape(name)

    def get(self, name: str) -> torch.Tensor:
        t = self.ckpt.get(name)
        if name not in self._scaled:
            return t
        scale = self.ckpt.get(name + SCALE_SUFFIX).float()
        if t.dtype != torch.int8 or t.dim() != 2 or scale.shape != (t.shape[0],):
            raise CheckpointError(f"{name}: int8 storage needs an int8 matrix and one scale per row, got "
                                  f"{t.dtype} {tuple(t.shape)} with scales {tuple(scale.shape)}")
        return t.float() * scale[:, None]


def save_checkpoint(out_dir: str | Path, tensors: dict[str, torch.Tensor], config: dict[str, Any]) -> Path:
    """A drafter directory: ``model.safetensors`` (CPU copies of ``tensors``), then ``config.json``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_safetensors_atomically({k: v.detach().cpu() for k, v in tensors.items()}, out / TENSORS_FILE,
                                 metadata={"format": "pt"})
    write_json_atomically(out / CONFIG_FILE, config)
    return out


__all__ = ["CONFIG_FILE", "STORAGE", "StoredTensors", "TENSORS_FILE", "read_config_json", "save_checkpoint",
           "stored_tensors", "write_json_atomically"]
