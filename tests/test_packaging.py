"""The package layout of docs/architecture.md §1: every folder reachable as hyspec.*, import stays light."""
from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = {"hyspec": "core", "hyspec.backends": "backends", "hyspec.npu_ops": "npu_ops",
           "hyspec.cuda_ops": "cuda_ops", "hyspec.cpu_ops": "cpu_ops"}


def test_every_package_folder_is_listed_in_pyproject():
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert cfg["package-dir"] == FOLDERS
    listed = set(cfg["packages"])
    found = set()
    for name, folder in FOLDERS.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder)
            found.add(".".join([name, *rel.parts]) if rel.parts else name)
    assert found - listed == set(), "packages missing from pyproject.toml [tool.setuptools] packages"
    assert listed - found == set(), "pyproject.toml lists packages that have no folder"


def test_import_hyspec_does_not_import_vendor_packages():
    code = ("import sys, hyspec, hyspec.backend, hyspec.ops; "
            "bad = [m for m in ('torch_npu', 'triton', 'onnxruntime', 'ray', 'fastapi', 'transformers') if m in sys.modules]; "
            "print(bad); sys.exit(1 if bad else 0)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_cli_help_for_every_subcommand():
    from hyspec.cli.main import COMMANDS
    for name in COMMANDS:
        r = subprocess.run([sys.executable, "-m", "hyspec.cli.main", name, "--help"], capture_output=True, text=True)
        assert r.returncode == 0, (name, r.stderr)
        assert "usage: hyspec" in r.stdout
