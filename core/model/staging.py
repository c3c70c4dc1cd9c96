"""Directories written under a temporary name and renamed when complete, so a reader never sees half of one.
(No torch here: the CLI imports the exporters that use it while building its parser.)"""
from __future__ import annotations

import os
from pathlib import Path


def publish_staged_directory(staging: Path, dst: Path) -> None:
    """Give ``staging`` the permissions of a normal directory (the temporary files' 0600 and mkdtemp's 0700 would
    hide it from other users, e.g. a vLLM run as another user) and rename it to ``dst``, which must be absent or an
    empty directory (the callers check)."""
    umask = os.umask(0)
    os.umask(umask)
    for file in staging.iterdir():
        if file.is_file():
            file.chmod(0o666 & ~umask)
    staging.chmod(0o777 & ~umask)
    if dst.exists():
        dst.rmdir()
    staging.rename(dst)
