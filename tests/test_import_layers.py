"""The import layers of pyproject.toml's [tool.importlinter] contracts hold (issue 49).

``engine -> spec -> policy, remote -> drafters -> seam -> model, kv, ops, backend``, with no edge
back; the runtime never imports its applications.  Runs ``lint-imports`` (import-linter, the dev
extra) over the source, so a new upward import fails here with import-linter's own report of it.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("importlinter", reason="import-linter is in the dev extra: pip install -e '.[dev]'")

ROOT = Path(__file__).resolve().parents[1]


def test_import_contracts_are_kept() -> None:
    run = subprocess.run(
        [sys.executable, "-c", "import sys; from importlinter.cli import lint_imports_command; "
                               "sys.exit(lint_imports_command())", "--no-cache", str(ROOT / "pyproject.toml")],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    report = run.stdout + run.stderr
    assert run.returncode == 0, f"import-linter contracts broken (lint-imports exit {run.returncode}):\n{report}"
    assert "BROKEN" not in report and "KEPT" in report, report
