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
from hyspec.model.checkpoint_quant import FP8_DTYPES, WeightScales, checkpoint_config, dequantize_fp8, read_weight_scales


class SafetensorsCheckpoint:
    """Tensor name -> shard file index over a Hugging Face checkpoint directory.

    A ``quantization_config`` in the directory's ``config.json`` is honoured here, so that every reader
    (target, drafters, converters) sees real weights: FP8 weights come back multiplied by their scales
    (hyspec.model.checkpoint_quant), the scale tensors are not listed as tensors of their own, and any
    other quantization method is refused by name when the checkpoint is opened.
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.weight_scales: WeightScales | None = read_weight_scales(checkpoint_config(self.path), str(self.path))
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
                pickled = sorted(p.name for p in self.path.glob("*.bin"))
                advice = (f"; {', '.join(pickled[:3])} can be converted once, explicitly: hyspec convert "
                          f"{self.path} NEW_DIR (torch.load with weights_only=True, then safetensors)") if pickled else ""
                raise CheckpointError(f"no *.safetensors weights in {self.path} (hyspec never loads pickled .bin "
                                      f"files, a pickle can run code){advice}")
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
        """The tensors a model reads: an FP8 checkpoint's scales are part of their weights, not listed."""
        scales = self.weight_scales
        return sorted(n for n in self._file_of if scales is None or not scales.is_scale(n))

    def __contains__(self, name: str) -> bool:
        return name in self._file_of

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._open(self._file(name)).get_slice(name).get_shape())

    def get(self, name: str) -> torch.Tensor:
        """The tensor as stored, except FP8 weights: those come back dequantized to fp32 with their scales."""
        tensor = self._read(name)
        if tensor.dtype not in FP8_DTYPES:
            return tensor
        scales = self.weight_scales
        if scales is None:
            raise CheckpointError(
                f"tensor {name!r} is stored in {tensor.dtype} but {self.path / 'config.json'} has no "
                "quantization_config saying where its scales are; loading it without them would be wrong")
        scale_name = scales.scale_name(name)
        if scale_name is None or scale_name not in self._file_of:
            raise CheckpointError(f"FP8 tensor {name!r} has no scale tensor {scale_name!r} in {self.path} "
                                  f"(quant_method {scales.method!r})")
        return dequantize_fp8(tensor, self._read(scale_name), scales.block_size, name)

    def _read(self, name: str) -> torch.Tensor:
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
                       "I64": torch.int64, "I32": torch.int32, "BOOL": torch.bool,
                       # FP8 weights are read dequantized (``get``), in fp32
                       "F8_E4M3": torch.float32, "F8_E5M2": torch.float32}


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
