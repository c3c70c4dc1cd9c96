"""Reading ``*.safetensors`` checkpoints (single file or sharded), never unpickling.

Shared by the target loader and the drafter loaders.  Every failure names the
file or tensor at fault: a missing shard, a truncated file, an unknown dtype.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable

import torch

from hyspec.errors import CheckpointError


class SafetensorsCheckpoint:
    """Tensor name -> shard file index over a Hugging Face checkpoint directory."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._file_of: dict[str, Path] = {}
        self._handles: dict[Path, object] = {}
        index = self.path / "model.safetensors.index.json"
        if index.is_file():
            try:
                weight_map = json.loads(index.read_text())["weight_map"]
            except (json.JSONDecodeError, KeyError, TypeError) as exc:
                raise CheckpointError(f"{index} is not a valid safetensors index: {exc}") from None
            for name, shard in weight_map.items():
                self._file_of[name] = self.path / shard
            for shard in sorted(set(self._file_of.values())):
                if not shard.is_file():
                    raise CheckpointError(f"shard {shard.name} listed in {index.name} is missing from {self.path}")
        else:
            files = sorted(self.path.glob("*.safetensors"))
            if not files:
                raise CheckpointError(f"no *.safetensors weights in {self.path} (hyspec never loads pickled .bin files)")
            for f in files:
                for name in self._open(f).keys():
                    self._file_of[name] = f
        for f in set(self._file_of.values()):
            self._open(f)  # validate every shard's header now, not halfway through loading

    def _open(self, file: Path):
        handle = self._handles.get(file)
        if handle is None:
            from safetensors import safe_open

            try:
                handle = safe_open(str(file), framework="pt", device="cpu")
            except Exception as exc:  # safetensors raises its own error types for corrupt headers
                raise CheckpointError(f"{file.name} in {self.path} is corrupt or truncated: {exc}") from None
            self._handles[file] = handle
        return handle

    def names(self) -> list[str]:
        return sorted(self._file_of)

    def __contains__(self, name: str) -> bool:
        return name in self._file_of

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._open(self._file(name)).get_slice(name).get_shape())

    def get(self, name: str) -> torch.Tensor:
        file = self._file(name)
        try:
            return self._open(file).get_tensor(name)
        except Exception as exc:
            raise CheckpointError(f"tensor {name!r} in {file.name} cannot be read: {exc}") from None

    def _file(self, name: str) -> Path:
        try:
            return self._file_of[name]
        except KeyError:
            raise CheckpointError(f"tensor {name!r} is missing from the checkpoint in {self.path}") from None

    def dtypes(self) -> set[torch.dtype]:
        return {self.get_dtype(n) for n in self.names()}

    def get_dtype(self, name: str) -> torch.dtype:
        dtype = self._open(self._file(name)).get_slice(name).get_dtype()
        return _SAFETENSORS_DTYPES.get(dtype, torch.float32)


_SAFETENSORS_DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16,
                       "I64": torch.int64, "I32": torch.int32, "BOOL": torch.bool}


def check_shape(name: str, tensor: torch.Tensor, expected: Iterable[int]) -> torch.Tensor:
    expected = tuple(expected)
    if tuple(tensor.shape) != expected:
        raise CheckpointError(
            f"tensor {name!r} has shape {tuple(tensor.shape)}, but the config implies {expected}")
    return tensor


def write_safetensors_atomically(tensors: dict[str, torch.Tensor], file: Path, metadata: dict[str, str] | None = None) -> None:
    """Write ``file`` via a temporary name so an interrupted write never looks complete."""
    from safetensors.torch import save_file

    tmp = file.with_name(file.name + ".tmp")
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp), metadata=metadata)
    tmp.replace(file)
