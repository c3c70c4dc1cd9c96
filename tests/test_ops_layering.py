"""``hyspec.ops`` is the bottom layer: it imports nothing from ``hyspec.spec`` (nor from the engine or drafters).

Checked twice: statically (every import statement of core/ops, including lazy
ones inside functions and ``TYPE_CHECKING`` blocks) and at run time (importing
each ``hyspec.ops`` module in a fresh interpreter loads no ``hyspec.spec``
module).
"""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

OPS_DIR = Path(__file__).resolve().parents[1] / "core" / "ops"
FORBIDDEN = ("hyspec.spec", "hyspec.engine", "hyspec.drafters")
MODULES = sorted(f"hyspec.ops.{p.stem}" for p in OPS_DIR.glob("*.py") if p.stem != "__init__")


def _imported_names(tree: ast.AST) -> list[str]:
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
    return names


def test_no_ops_source_file_imports_the_spec_layer():
    files = sorted(OPS_DIR.glob("*.py"))
    assert files and "rejection.py" in {f.name for f in files}
    bad = [f"{f.name}: {name}" for f in files for name in _imported_names(ast.parse(f.read_text()))
           if name.startswith(FORBIDDEN)]
    assert not bad, bad


def test_importing_the_ops_modules_loads_no_spec_module():
    """One fresh interpreter: importing any ``hyspec.ops`` module runs the package's ``__init__`` too."""
    code = ("import importlib, sys\n"
            f"for name in {['hyspec.ops', *MODULES]!r}:\n"
            "    importlib.import_module(name)\n"
            "import hyspec.ops\n"
            "ops = hyspec.ops.reference_ops()\n"
            "assert callable(ops.rejection_sample) and callable(ops.logits)\n"
            f"bad = sorted(m for m in sys.modules if m.startswith({FORBIDDEN!r}))\n"
            "print(bad)\n"
            "raise SystemExit(1 if bad else 0)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert len(MODULES) >= 7  # attention, kv, logits, norm, rejection, rotary, sampling
