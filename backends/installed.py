"""Is a package installed, and which version?  Answered without importing it."""
from __future__ import annotations

from importlib import metadata


def dist_version(name: str) -> str | None:
    """An installed distribution's version from its metadata, or None when it is not installed."""
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None
