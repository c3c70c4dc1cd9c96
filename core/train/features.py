"""The frozen target's view of a batch: computed on the fly, or cached on disk (``--cache-hidden``).

The cache holds, per training window, the final hidden states and the aux
layers a recipe reads, in memory-mapped files under the working folder.  A
window is computed the first time a batch draws it and read back after, so
epochs past the first skip the target forward.  It survives interruption
(a window is marked filled only after its rows are written), which keeps a
resumed run identical to an uninterrupted one.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from hyspec.model.llama import CausalLM
from hyspec.train.base import TargetBatch
from hyspec.train.data import Windows

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def target_features(target: CausalLM, input_ids: torch.Tensor,  # [B, S]
                    aux_layers: tuple[int, ...]) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
    """hidden [B, S, H] after the final norm and aux {layer: [B, S, H]}, without autograd."""
    with torch.no_grad():
        out = target.forward_dense(input_ids, aux_layers=aux_layers)
    return out.hidden, dict(out.aux_hidden)


class HiddenCache:
    """Memory-mapped ``[W, S, H]`` tensors (final + each aux layer) plus a filled flag per window."""

    def __init__(self, folder: Path, windows: Windows, hidden_size: int, aux_layers: tuple[int, ...], key: str):
        self.folder, self.aux_layers = folder, tuple(aux_layers)
        self.shape = (len(windows), windows.seq_len, hidden_size)
        self.key = key  # fingerprint of target + windows + layers: a stale cache is thrown away
        self._tensors: dict[str, torch.Tensor] | None = None
        self._filled: torch.Tensor | None = None
        meta = self._read_meta()
        if meta is not None and meta.get("key") == key:
            self._open(_DTYPES[meta["dtype"]], create=False)
        elif folder.exists():
            shutil.rmtree(folder)

    def _read_meta(self) -> dict | None:
        try:
            return json.loads((self.folder / "meta.json").read_text())
        except (OSError, json.JSONDecodeError):
            return None

    def _names(self) -> list[str]:
        return ["final", *(f"aux{layer}" for layer in self.aux_layers)]

    def _open(self, dtype: torch.dtype, create: bool) -> None:
        W, S, H = self.shape
        if create:
            self.folder.mkdir(parents=True, exist_ok=True)
            for name in self._names():  # sparse files of the full size; from_file maps them shared
                with open(self.folder / f"{name}.bin", "wb") as f:
                    f.truncate(W * S * H * dtype.itemsize)
            with open(self.folder / "filled.bin", "wb") as f:
                f.truncate(W)
            dtype_name = next(k for k, v in _DTYPES.items() if v == dtype)
            (self.folder / "meta.json").write_text(json.dumps({"key": self.key, "dtype": dtype_name,
                                                               "shape": list(self.shape)}))
        self._tensors = {name: torch.from_file(str(self.folder / f"{name}.bin"), shared=True, size=W * S * H,
                                               dtype=dtype).view(W, S, H) for name in self._names()}
        self._filled = torch.from_file(str(self.folder / "filled.bin"), shared=True, size=W, dtype=torch.uint8)

    def get(self, target: CausalLM, indices: torch.Tensor,  # [B] window indices
            input_ids: torch.Tensor) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:  # input_ids [B, S]
        missing = [i for i, w in enumerate(indices.tolist()) if self._filled is None or not self._filled[w]]
        if missing:
            # the whole batch when all of it is new (the usual first-epoch case): the same numbers as on the fly
            rows = torch.tensor(missing)
            hidden, aux = target_features(target, input_ids if len(missing) == len(indices) else input_ids[rows],
                                          self.aux_layers)
            if self._tensors is None:
                self._open(hidden.dtype, create=True)
            fresh = {"final": hidden, **{f"aux{layer}": aux[layer] for layer in self.aux_layers}}
            windows = indices[rows]
            for name, value in fresh.items():
                self._tensors[name][windows] = value.to(self._tensors[name].dtype)
            self._filled[windows] = 1  # after the rows: an interrupted write leaves them unfilled
        assert self._tensors is not None
        hidden = self._tensors["final"][indices]
        aux = {layer: self._tensors[f"aux{layer}"][indices] for layer in self.aux_layers}
        return hidden, aux

    @property
    def filled(self) -> int:
        return 0 if self._filled is None else int(self._filled.sum())


class FeatureSource:
    """Makes :class:`TargetBatch` es for the trainer, from the target directly or through the cache."""

    def __init__(self, target: CausalLM, windows: Windows, aux_layers: tuple[int, ...], cache: HiddenCache | None):
        self.target, self.windows, self.aux_layers, self.cache = target, windows, tuple(aux_layers), cache

    def batch(self, indices: torch.Tensor) -> TargetBatch:  # indices [B]
        ids = self.windows.ids[indices]
        if self.cache is None:
            hidden, aux = target_features(self.target, ids, self.aux_layers)
        else:
            hidden, aux = self.cache.get(self.target, indices, ids)
        return TargetBatch(input_ids=ids, loss_mask=self.windows.loss_mask[indices], hidden=hidden, aux=aux)
