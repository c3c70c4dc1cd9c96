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
from hyspec.model.weights import write_safetensors_atomically

CONFIG_FILE = "config.json"
TENSORS_FILE = "model.safetensors"


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


def save_checkpoint(out_dir: str | Path, tensors: dict[str, torch.Tensor], config: dict[str, Any]) -> Path:
    """A drafter directory: ``model.safetensors`` (CPU copies of ``tensors``), then ``config.json``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_safetensors_atomically({k: v.detach().cpu() for k, v in tensors.items()}, out / TENSORS_FILE,
                                 metadata={"format": "pt"})
    write_json_atomically(out / CONFIG_FILE, config)
    return out


__all__ = ["CONFIG_FILE", "TENSORS_FILE", "read_config_json", "save_checkpoint", "write_json_atomically"]
