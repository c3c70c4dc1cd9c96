"""Model ids (``Qwen/Qwen3-0.6B``) resolved from the local Hugging Face cache, never downloaded.

A vLLM user passes a Hub id where hyspec used to take only paths.  Nothing may download here, so an id
is looked up with huggingface_hub's own cache resolution (``snapshot_download(..., local_files_only=True)``):
the same cache layout (``models--org--name/refs/main`` -> ``snapshots/<commit>``), the same environment
(``HF_HOME``, ``HF_HUB_CACHE``; ``HF_HUB_OFFLINE`` changes nothing since nothing is fetched), and the same
completeness check of a partly downloaded snapshot that vLLM gets with ``HF_HUB_OFFLINE=1``.

A path that exists is always a path; an id that is not cached is an error naming the cache folder looked at.
"""
from __future__ import annotations

import re
from pathlib import Path

from hyspec.errors import CheckpointError

# org/name, optionally @revision (a branch, tag or commit): Hugging Face's repo id characters
_REPO_ID = re.compile(r"^(?P<repo>[A-Za-z0-9][\w.-]*/[\w.-]+?)(?:@(?P<revision>[\w./-]+))?$")


def looks_like_model_id(model: str | Path) -> bool:
    """``org/name`` or ``org/name@revision``, and not an existing path (nor a ``.gguf`` file name)."""
    text = str(model)
    return (not Path(text).exists() and _REPO_ID.match(text) is not None and not text.startswith((".", "~"))
            and not text.lower().endswith(".gguf"))


def resolve_model(model: str | Path) -> Path:
    """The local path of ``model``: as given when it exists or is not an id (its loader then names it), else
    the cached snapshot of the Hub id -- the snapshot directory, or its one ``.gguf`` file when the repository
    holds GGUF files and no ``config.json``."""
    if not looks_like_model_id(model):
        return Path(model)
    match = _REPO_ID.match(str(model))
    repo_id, revision = match.group("repo"), match.group("revision")
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError

    looked_at = Path(constants.HF_HUB_CACHE) / ("models--" + repo_id.replace("/", "--"))
    try:
        snapshot = Path(snapshot_download(repo_id, revision=revision, local_files_only=True))
    except HFValidationError as exc:
        raise CheckpointError(f"model {str(model)!r} is neither an existing path nor a valid Hugging Face id: "
                              f"{exc}") from None
    except LocalEntryNotFoundError as exc:
        incomplete = type(exc).__name__ == "IncompleteSnapshotError"
        what = "is only partly in" if incomplete else "is not in"
        raise CheckpointError(
            f"model {str(model)!r} is not a local path, and the Hugging Face id {what} the local cache: looked in "
            f"{looked_at} (revision {revision or 'main'}; the cache is HF_HUB_CACHE, or HF_HOME/hub). hyspec never "
            f"downloads: fetch it where there is network (`hf download {repo_id}`) into that cache, or pass the "
            "model's directory") from None
    return _model_in_snapshot(snapshot, str(model))


def _model_in_snapshot(snapshot: Path, model: str) -> Path:
    if (snapshot / "config.json").is_file():
        return snapshot
    ggufs = sorted(snapshot.glob("*.gguf"))
    if len(ggufs) == 1:
        return ggufs[0]
    if ggufs:
        raise CheckpointError(f"{model} holds {len(ggufs)} GGUF files in {snapshot} ({', '.join(g.name for g in ggufs)}): "
                              "pass the path of the one to load")
    return snapshot  # no config.json: the loader names what is missing in this folder
