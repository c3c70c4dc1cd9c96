"""Where a training run keeps its state, and how its output appears atomically.

``OUT.partial/`` is the run's working folder: the resumable checkpoint, the
self-generated data, the hidden-state cache and the output being written
(``OUT.partial/output``).  The finished output is renamed onto ``OUT`` as the
last act, so ``OUT`` exists only when complete (it then holds ``config.json``
and ``training_log.json``, the latter written last); an interrupted run
leaves nothing but the ``.partial`` folder, whose name never looks complete.
"""
from __future__ import annotations

import fcntl
import os
import shutil
from pathlib import Path
from typing import Any

import torch

from hyspec.errors import HyspecError

LOG_FILE = "training_log.json"


def is_complete(out: Path) -> bool:
    return (out / "config.json").is_file() and (out / LOG_FILE).is_file()


def check_out_dir(out: Path, overwrite: bool) -> None:
    """Refuse to replace a finished output (or a folder that is not ours) unless asked to."""
    if not out.exists():
        return
    if not out.is_dir():
        raise HyspecError(f"--out {out} exists and is not a directory")
    if overwrite:
        return
    if is_complete(out):
        raise HyspecError(f"--out {out} already holds a trained drafter; pass --overwrite to replace it")
    if any(out.iterdir()):
        raise HyspecError(f"--out {out} exists and is not empty (and is not a train-draft output); "
                          "pass --overwrite to replace it")


class Workspace:
    """The working folder of one run, locked against a second run on the same output."""

    def __init__(self, out: Path, folder: Path | None = None):
        self.out = out
        self.folder = folder or out.with_name(out.name + ".partial")
        self._lock = None

    @property
    def checkpoint(self) -> Path:
        return self.folder / "checkpoint.pt"

    @property
    def staging(self) -> Path:
        return self.folder / "output"

    def open(self) -> "Workspace":
        self.folder.mkdir(parents=True, exist_ok=True)
        self._lock = open(self.folder / "lock", "w")
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock.close()
            self._lock = None
            raise HyspecError(f"another train-draft run is using {self.folder}") from None
        return self

    def close(self) -> None:
        if self._lock is not None:
            self._lock.close()
            self._lock = None

    def save_checkpoint(self, state: dict[str, Any]) -> None:
        tmp = self.checkpoint.with_name(self.checkpoint.name + ".tmp")
        torch.save(state, tmp)
        os.replace(tmp, self.checkpoint)

    def load_checkpoint(self) -> dict[str, Any] | None:
        if not self.checkpoint.is_file():
            return None
        try:  # our own file: weights_only keeps it from unpickling anything but tensors and plain data
            return torch.load(self.checkpoint, weights_only=True)
        except Exception as exc:
            raise HyspecError(f"checkpoint {self.checkpoint} cannot be read ({exc}); "
                              "delete it (or the whole folder) to start over") from None

    def fresh_staging(self) -> Path:
        shutil.rmtree(self.staging, ignore_errors=True)
        self.staging.mkdir(parents=True)
        return self.staging

    def publish(self, keep_work: bool = False) -> None:
        """Rename the staged output onto OUT (replacing an old one), then drop the working folder."""
        if not is_complete(self.staging):
            raise HyspecError(f"internal: staged output in {self.staging} is incomplete; not publishing it")
        self.out.parent.mkdir(parents=True, exist_ok=True)
        staged = self.staging
        if os.stat(self.folder).st_dev != os.stat(self.out.parent).st_dev:
            # --work-dir on another file system: copy next to OUT first, so the last step is still a rename
            staged = self.out.with_name(f".{self.out.name}.incoming")
            shutil.rmtree(staged, ignore_errors=True)
            shutil.copytree(self.staging, staged)
        old = self.out.with_name(f".{self.out.name}.replaced")
        if self.out.exists():
            shutil.rmtree(old, ignore_errors=True)
            os.replace(self.out, old)
        os.replace(staged, self.out)
        shutil.rmtree(old, ignore_errors=True)
        self.close()
        if not keep_work:
            shutil.rmtree(self.folder, ignore_errors=True)
