"""The shapes of what hyspec's vllm-ascend plugin touches, read from vllm-ascend's source files with ``ast``.

Reading the source instead of importing it keeps the check cheap and side-effect free: vLLM calls general
plugins in every process, and importing vllm-ascend's model runner pulls in torch_npu and CANN.  The same
reader makes the committed record (``vllm_ascend_v0.23.0.json``, from the tagged sources) and reads the
installed vllm-ascend at start-up, so the two are compared like for like:

    python -m hyspec.vllm.ascend_shapes SRC --tag v0.23.0 --commit SHA > core/vllm/vllm_ascend_v0.23.0.json

where SRC holds ``vllm_ascend/`` at that commit (``git archive SHA vllm_ascend | tar -x -C SRC``).

A shape is a function's parameters (``"name"``, ``"name="`` with a default, ``"*args"``, ``"**kwargs"``,
``"*"``), where the runner's module takes ``get_spec_decode_method`` from, which names ``_get_drafter`` calls,
which methods the runner calls on its drafter in every set-up (``load_model``, ``_dummy_run``), and which
input-batch arrays exist.  ``custom_class_branch`` says whether the installed source already has the branch.
"""
from __future__ import annotations

import argparse
import ast
import json
import sys
from pathlib import Path
from typing import Any

RECORD = Path(__file__).with_name("vllm_ascend_v0.23.0.json")

SPEC_DECODE = "vllm_ascend/spec_decode/__init__.py"
MODEL_RUNNER = "vllm_ascend/worker/model_runner_v1.py"
INPUT_BATCH = "vllm_ascend/worker/npu_input_batch.py"
RUNNER_CLASS = "NPUModelRunner"
INPUT_BATCH_CLASS = "NPUInputBatch"

#: file -> functions ("Class.method" for methods) whose parameters are recorded: those the plugin replaces
#: and calls through to (the factory, the runner's dispatch) and the one that looks the factory up
FUNCTIONS = {
    SPEC_DECODE: ("get_spec_decode_method",),
    MODEL_RUNNER: (f"{RUNNER_CLASS}._get_drafter", f"{RUNNER_CLASS}.propose_draft_token_ids"),
}
#: the runner methods that call its drafter whatever the speculative method (the others are behind
#: isinstance / use_eagle() checks, or are propose_draft_token_ids, which the plugin takes over)
LIFECYCLE_METHODS = (f"{RUNNER_CLASS}.load_model", f"{RUNNER_CLASS}._dummy_run")
#: the input-batch arrays vLLM's runner passes a custom_class proposer (num_tokens_no_spec, token_ids_cpu), and
#: those hyspec's proposer reads from its caller to follow requests across rows (hyspec.vllm.requests):
#: num_prompt_tokens, and _req_ids, which vLLM's InputBatch.req_ids returns (NPUInputBatch subclasses it)
INPUT_BATCH_ARRAYS = ("num_tokens_no_spec", "token_ids_cpu", "num_prompt_tokens", "_req_ids")
BRANCH_MARKERS = ("custom_class", "create_custom_proposer")


def parameters(function: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    """A function's parameters as the record writes them: ``name``, ``name=``, ``*args``, ``*``, ``**kw``."""
    a = function.args
    positional = [*a.posonlyargs, *a.args]
    first_default = len(positional) - len(a.defaults)
    out = [p.arg + ("=" if i >= first_default else "") for i, p in enumerate(positional)]
    if a.vararg is not None:
        out.append(f"*{a.vararg.arg}")
    elif a.kwonlyargs:
        out.append("*")
    out += [p.arg + ("=" if d is not None else "") for p, d in zip(a.kwonlyargs, a.kw_defaults)]
    if a.kwarg is not None:
        out.append(f"**{a.kwarg.arg}")
    return out


def _definitions(tree: ast.Module) -> dict[str, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef]:
    """Top-level functions and classes by name, and each class's own methods as ``Class.method``."""
    found: dict[str, Any] = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            found[node.name] = node
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    found[f"{node.name}.{item.name}"] = item
    return found


def _mentions_branch(node: ast.AST) -> bool:
    return any((isinstance(n, ast.Constant) and n.value in BRANCH_MARKERS)
               or (isinstance(n, ast.Name) and n.id in BRANCH_MARKERS)
               or (isinstance(n, ast.Attribute) and n.attr in BRANCH_MARKERS) for n in ast.walk(node))


def _called_names(node: ast.AST) -> list[str]:
    return sorted({n.func.id for n in ast.walk(node) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)})


def _drafter_calls(node: ast.AST) -> list[str]:
    """The X of every ``self.drafter.X(...)`` in ``node``."""
    calls = set()
    for n in ast.walk(node):
        if (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and isinstance(n.func.value, ast.Attribute)
                and n.func.value.attr == "drafter" and isinstance(n.func.value.value, ast.Name)
                and n.func.value.value.id == "self"):
            calls.add(n.func.attr)
    return sorted(calls)


def _imported_from(tree: ast.Module, name: str) -> str | None:
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and any((alias.asname or alias.name) == name for alias in node.names):
            return node.module
    return None


def _assigned_self_attributes(node: ast.AST) -> set[str]:
    return {t.attr for n in ast.walk(node) if isinstance(n, (ast.Assign, ast.AnnAssign))
            for t in (n.targets if isinstance(n, ast.Assign) else [n.target])
            if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self"}


def read_shapes(root: Path) -> dict[str, Any]:
    """The shapes of the vllm-ascend source under ``root`` (the folder that holds ``vllm_ascend/``).

    A file or function that is missing is left out of the result (the comparison then names it)."""
    trees: dict[str, ast.Module] = {}
    for rel in (SPEC_DECODE, MODEL_RUNNER, INPUT_BATCH):
        try:
            trees[rel] = ast.parse((root / rel).read_text(encoding="utf-8"), filename=rel)
        except (OSError, SyntaxError):
            continue
    functions: dict[str, list[str]] = {}
    branch = False
    defs = {rel: _definitions(tree) for rel, tree in trees.items()}
    for rel, names in FUNCTIONS.items():
        for name in names:
            node = defs.get(rel, {}).get(name)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                functions[f"{rel}::{name}"] = parameters(node)
                branch = branch or _mentions_branch(node)
    runner = defs.get(MODEL_RUNNER, {})
    shapes: dict[str, Any] = {
        "functions": functions,
        "imports": {},
        "calls": {},
        "drafter_calls": {f"{MODEL_RUNNER}::{m}": _drafter_calls(runner[m]) for m in LIFECYCLE_METHODS if m in runner},
        "input_batch_arrays": [],
        "custom_class_branch": branch,
    }
    if MODEL_RUNNER in trees:
        source = _imported_from(trees[MODEL_RUNNER], "get_spec_decode_method")
        if source is not None:
            shapes["imports"][f"{MODEL_RUNNER}::get_spec_decode_method"] = source
        getter = runner.get(f"{RUNNER_CLASS}._get_drafter")
        if getter is not None:
            shapes["calls"][f"{MODEL_RUNNER}::{RUNNER_CLASS}._get_drafter"] = _called_names(getter)
    init = defs.get(INPUT_BATCH, {}).get(f"{INPUT_BATCH_CLASS}.__init__")
    if init is not None:
        assigned = _assigned_self_attributes(init)
        shapes["input_batch_arrays"] = [a for a in INPUT_BATCH_ARRAYS if a in assigned]
    return shapes


def load_record(path: Path = RECORD) -> dict[str, Any]:
    """The committed record: where it was read (``repository``, ``tag``, ``commit``) and its ``shapes``."""
    return json.loads(path.read_text())


def differences(installed: dict[str, Any], recorded: dict[str, Any], label: str = "the record") -> list[str]:
    """What differs between two shapes, one line each (empty: the same); ``label`` names the recorded one.
    ``custom_class_branch`` is not compared (the plugin decides on it before comparing)."""
    lines = []
    for section in ("functions", "imports", "calls", "drafter_calls"):
        have, want = installed.get(section, {}), recorded.get(section, {})
        for key in sorted(want):
            if key not in have:
                lines.append(f"{key}: missing ({section})")
            elif have[key] != want[key]:
                lines.append(f"{key}: {section} {have[key]} where {label} has {want[key]}")
    missing = [a for a in recorded.get("input_batch_arrays", []) if a not in installed.get("input_batch_arrays", [])]
    if missing:
        lines.append(f"{INPUT_BATCH}::{INPUT_BATCH_CLASS}.__init__: no {', '.join(missing)}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Print the record of a vllm-ascend checkout's shapes (JSON).")
    parser.add_argument("source", type=Path, help="the folder that holds vllm_ascend/")
    parser.add_argument("--tag", required=True)
    parser.add_argument("--commit", required=True)
    parser.add_argument("--vllm", default=None, help="the vLLM release that vllm-ascend version pairs with")
    args = parser.parse_args(argv)
    record = {"repository": "https://github.com/vllm-project/vllm-ascend", "tag": args.tag, "commit": args.commit,
              "vllm": args.vllm, "files": sorted({SPEC_DECODE, MODEL_RUNNER, INPUT_BATCH}),
              "shapes": read_shapes(args.source)}
    json.dump(record, sys.stdout, indent=1)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
