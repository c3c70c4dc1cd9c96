"""The embedded default: a small code LM and its drafters, shipped in ``assets/``.

They run with no download.  ``HYSPEC_ASSETS`` points elsewhere (for a wheel
install or a rebuilt set).
"""
from __future__ import annotations

import os
from pathlib import Path

from hyspec.errors import CheckpointError

DRAFTER_DIRS = {
    "draft_model": "default-draft-model",
    "eagle": "default-eagle",
    "eagle3": "default-eagle3",
    "mtp": "default-mtp",
    "dflash": "default-dflash",
    "dspark": "default-dspark",
}


def assets_dir() -> Path:
    env = os.environ.get("HYSPEC_ASSETS")
    return Path(env) if env else Path(__file__).resolve().parents[1] / "assets"


def default_model() -> Path:
    """Directory of the embedded default target model."""
    path = assets_dir() / "default-target"
    if not (path / "config.json").is_file():
        raise CheckpointError(
            f"the embedded default model is missing from {path}; rebuild it with "
            "`python scripts/train_default_model.py` or pass model=... explicitly")
    return path


def default_drafter(method: str) -> Path:
    """Directory of the embedded default's trained drafter for ``method``."""
    if method not in DRAFTER_DIRS:
        raise CheckpointError(f"no embedded drafter for method {method!r}; methods with one: {', '.join(DRAFTER_DIRS)}")
    path = assets_dir() / DRAFTER_DIRS[method]
    if not (path / "config.json").is_file():
        raise CheckpointError(
            f"the embedded {method} drafter is missing from {path}; train it with "
            f"`hyspec train-draft --method {method} --target {default_model()} --out {path}`")
    return path
