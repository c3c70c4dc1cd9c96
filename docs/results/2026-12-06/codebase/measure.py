"""Issue 49's structural figures for one checkout: in-function imports, package line counts, the front page,
docs/results, and the tracked tree.

    python docs/results/2026-12-06/codebase/measure.py [REPO_ROOT] > figures.json

Run it on the commit before the change (a ``git worktree``) and after; both outputs are kept here.
"""
from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path


def _imports(tree: ast.AST) -> tuple[int, int, int, int]:
    """(internal total, internal inside functions, all total, all inside functions); internal = hyspec.*"""
    counts = [0, 0, 0, 0]

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inside = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                if isinstance(child, ast.ImportFrom):
                    names = [child.module or ""] if child.level == 0 else ["hyspec"]
                else:
                    names = [a.name for a in child.names]
                internal = any(n == "hyspec" or n.startswith("hyspec.") for n in names)
                counts[2] += 1
                counts[3] += in_function
                if internal:
                    counts[0] += 1
                    counts[1] += in_function
            visit(child, inside)

    visit(tree, False)
    return tuple(counts)


def _lines(paths: list[Path]) -> int:
    return sum(len(p.read_text().splitlines()) for p in paths)


def measure(root: Path) -> dict:
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=root, capture_output=True, check=True).stdout
    files = [root / f for f in tracked.decode().split("\0") if f]
    core_py = [f for f in files if f.suffix == ".py" and f.relative_to(root).parts[0] == "core" and f.exists()]
    totals = [0, 0, 0, 0]
    for f in core_py:
        for i, c in enumerate(_imports(ast.parse(f.read_text()))):
            totals[i] += c
    packages = {}
    for pkg in ("spec", "dispatch", "policy"):
        py = [f for f in core_py if f.relative_to(root).parts[1:2] == (pkg,)]
        packages[f"core/{pkg}"] = {"files": len(py), "lines": _lines(py)}
    results = [f for f in files if f.relative_to(root).parts[:2] == ("docs", "results") and f.exists()]
    return {
        "imports_hyspec_total": totals[0], "imports_hyspec_in_functions": totals[1],
        "imports_all_total": totals[2], "imports_all_in_functions": totals[3],
        "packages": packages,
        "readme_lines": len((root / "README.md").read_text().splitlines()),
        "docs_results_files": len(results),
        "docs_results_bytes": sum(f.stat().st_size for f in results),
        "docs_results_code_files": sum(f.suffix in (".py", ".sh", ".patch") for f in results),
        "scripts_files": sum(f.relative_to(root).parts[0] == "scripts" for f in files),
        "tracked_bytes": sum(f.stat().st_size for f in files if f.exists()),
    }


if __name__ == "__main__":
    print(json.dumps(measure(Path(sys.argv[1] if len(sys.argv) > 1 else ".").resolve()), indent=2))
