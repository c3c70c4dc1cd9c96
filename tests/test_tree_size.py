"""The tracked tree must fit the 64 MiB that travels to an accelerator machine (60 MiB, with room)."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LIMIT = 60 << 20


def test_tracked_tree_is_at_most_60_mib():
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    sizes = {}
    for name in files.decode().split("\0"):
        path = ROOT / name
        if name and path.is_file() and not path.is_symlink():
            sizes[name] = path.stat().st_size
    total = sum(sizes.values())
    largest = sorted(sizes.items(), key=lambda kv: -kv[1])[:5]
    assert total <= LIMIT, f"tracked tree is {total / 2**20:.1f} MiB (> 60 MiB); largest: {largest}"


DRAFTER_CAP = 12 * 10**6  # 12 MB per drafter (issue budget): about 8 MB on average leaves room for all six


def test_every_drafter_in_assets_fits_its_cap():
    from hyspec.assets import assets_dir
    from hyspec.drafters.methods import drafter_dirs

    for method, folder in drafter_dirs().items():
        path = assets_dir() / folder
        if not path.is_dir():
            continue
        size = sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
        assert size <= DRAFTER_CAP, f"the {method} drafter in {path} is {size / 1e6:.1f} MB (cap 12 MB)"
