"""``hyspec convert``: a pickled ``pytorch_model.bin`` checkpoint rewritten as safetensors, in one explicit step.

Loading never unpickles (hyspec.model.weights refuses ``.bin`` files): a pickle can run code.  EAGLE-1/2
heads and many older checkpoints are published only as ``pytorch_model.bin``, so this step reads them with
``torch.load(..., weights_only=True)`` -- torch's restricted unpickler, which accepts tensors, plain
containers and numbers and refuses any other object -- and writes ``model.safetensors`` beside a copy of
the directory's JSON and tokenizer files.  It runs only when asked for, says what it read, and writes a new
directory via a temporary name, so an interrupted conversion leaves nothing that looks complete.
"""
from __future__ import annotations

import json
import shutil
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import torch

from hyspec.errors import CheckpointError
from hyspec.model.staging import publish_staged_directory

#: files copied from the source directory unchanged (configs, tokenizers, chat templates)
_COPIED_SUFFIXES = (".json", ".jinja", ".txt", ".model", ".tiktoken")
_INDEX = "pytorch_model.bin.index.json"


@dataclass
class ConversionReport:
    """What was read and written."""

    sources: list[Path]
    out: Path
    tensors: int = 0
    parameters: int = 0
    dtypes: Counter = field(default_factory=Counter)
    copied: list[str] = field(default_factory=list)

    def summary(self) -> str:
        kinds = ", ".join(f"{n} {str(d).removeprefix('torch.')}" for d, n in sorted(self.dtypes.items(), key=str))
        return (f"read {self.tensors} tensors ({self.parameters:,} values: {kinds}) from "
                f"{', '.join(s.name for s in self.sources)} with torch.load(weights_only=True); wrote "
                f"{self.out / 'model.safetensors'}" + (f" and copied {', '.join(self.copied)}" if self.copied else ""))


def bin_files(src: Path) -> list[Path]:
    """The pickled weight files of a directory (an index's shards, else ``*.bin``), or ``[src]`` for a file."""
    if src.is_file():
        return [src]
    index = src / _INDEX
    if index.is_file():
        try:
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as exc:
            raise CheckpointError(f"{index} is not a valid weight index: {exc}") from None
        files = [src / s for s in shards]
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise CheckpointError(f"shards {missing} listed in {index.name} are missing from {src}")
        return files
    return sorted(p for p in src.glob("*.bin") if p.is_file())


def convert_bin(src: str | Path, out: str | Path) -> ConversionReport:
    """Rewrite the ``.bin`` checkpoint at ``src`` (a directory or one file) as the new directory ``out``."""
    from safetensors.torch import save_file

    src, dst = Path(src), Path(out)
    if not src.exists():
        raise CheckpointError(f"{src} does not exist")
    files = bin_files(src)
    if not files:
        raise CheckpointError(f"no pytorch_model*.bin files in {src}: nothing to convert")
    if dst.exists() and (not dst.is_dir() or any(dst.iterdir())):
        raise CheckpointError(f"{dst} exists and is not an empty directory: choose a new one (nothing was written)")
    report = ConversionReport(sources=files, out=dst)
    tensors: dict[str, torch.Tensor] = {}
    for file in files:
        for name, tensor in _read(file).items():
            if name in tensors:
                raise CheckpointError(f"tensor {name!r} appears in more than one shard ({file.name})")
            # each tensor its own storage: safetensors refuses shared (tied) storage
            tensors[name] = tensor.detach().clone().contiguous()
            report.tensors += 1
            report.parameters += tensor.numel()
            report.dtypes[tensor.dtype] += 1
    dst.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{dst.name}.", dir=dst.parent))
    try:
        save_file(tensors, str(staging / "model.safetensors"), metadata={"format": "pt"})
        if src.is_dir():
            for extra in sorted(src.iterdir()):
                if extra.is_file() and extra.suffix in _COPIED_SUFFIXES and extra.name != _INDEX:
                    shutil.copy2(extra, staging / extra.name)
                    report.copied.append(extra.name)
        publish_staged_directory(staging, dst)  # dst: absent or empty, checked above
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return report


def _read(file: Path) -> dict[str, torch.Tensor]:
    try:
        state = torch.load(file, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch's UnpicklingError names the refused global
        raise CheckpointError(f"{file.name} is not a plain tensor checkpoint (torch.load with weights_only=True "
                              f"refused it: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}); "
                              "nothing was written") from None
    if isinstance(state, dict) and set(state) <= {"state_dict", "model"} and len(state) == 1:
        state = next(iter(state.values()))  # a training checkpoint's one wrapped state dict
    if not isinstance(state, dict) or not all(isinstance(k, str) and isinstance(v, torch.Tensor)
                                              for k, v in state.items()):
        kind = type(state).__name__ if not isinstance(state, dict) else "a dict with non-tensor entries"
        raise CheckpointError(f"{file.name} holds {kind}, not a flat name -> tensor state dict; nothing was written")
    return state
