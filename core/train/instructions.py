"""Prompts for self-distillation, built from text that ships with Python (never from HumanEval).

A drafter is trained on what the target says, so it needs prompts like the
ones the target will be asked.  They come from three places on any machine
with CPython:

* **functions of the standard library** (parsed with :mod:`ast`): chat
  instructions to write one from its signature and docstring, explain it,
  document it, add type hints to it, or find a bug planted in it; and raw
  code-completion heads (signature + docstring, the shape of a HumanEval
  prompt, from other code);
* **the Python reference documentation** shipped in ``pydoc_data.topics``:
  "explain this passage" questions;
* **general questions**: templates over a fixed list of everyday topics,
  written here and disjoint from ``hyspec bench``'s chat set.

:func:`build_prompts` is a pure function of ``(count, seed)`` and the running
interpreter's stdlib, so a data set can be rebuilt; :func:`write_prompts`
writes the JSONL that ``hyspec train-draft --self-generate-prompts`` reads
(``{"messages": [...]}`` for chat turns, ``{"prompt": "..."}`` for raw text).
"""
from __future__ import annotations

import ast
import json
import random
import re
import sysconfig
from dataclasses import dataclass
from pathlib import Path

#: share of each kind in a built set (weights, normalised by build_prompts)
KIND_WEIGHTS = {
    "write": 0.18, "explain": 0.14, "document": 0.10, "type_hints": 0.08, "fix": 0.08,  # chat, from stdlib code
    "complete": 0.20,  # raw completion heads from stdlib code
    "docs": 0.07,  # chat, from pydoc_data.topics
    "general": 0.15,  # chat, general questions
}
MAX_SOURCE_CHARS = 1400  # a function longer than this (about 350 tokens) is not used whole
MIN_DOC_CHARS = 30

GENERAL_TOPICS = (
    "photosynthesis", "black holes", "the French Revolution", "inflation", "vaccines", "plate tectonics",
    "the Roman Empire", "machine learning", "climate change", "the immune system", "electric cars",
    "the printing press", "compound interest", "volcanoes", "the human heart", "renewable energy",
    "the stock market", "DNA", "the Moon landing", "recycling", "honey bees", "the internet",
    "the Great Wall of China", "earthquakes", "antibiotics", "the solar system", "coffee", "meditation",
    "the Renaissance", "rainbows", "supply and demand", "the ocean tides", "democracy", "dinosaurs",
    "nuclear power", "the Industrial Revolution", "sleep", "exercise", "time zones", "the piano",
    "chess", "bread baking", "cloud computing", "gravity", "the Amazon rainforest", "elections",
    "public speaking", "budgeting", "learning a language", "job interviews", "gardening", "marathons",
    "the periodic table", "lightning", "glaciers", "the Olympic Games", "credit scores", "electricity",
    "magnets", "the human brain", "viruses", "the camera", "airplanes", "the Silk Road", "Shakespeare",
    "jazz", "volunteering", "friendship", "procrastination", "open source software", "encryption",
    "databases", "version control", "unit testing", "recursion", "sorting algorithms", "operating systems",
    "computer networks", "spreadsheets", "password managers", "email etiquette", "team meetings",
)
GENERAL_TEMPLATES = (
    "Explain {topic} in simple terms.",
    "Give me three interesting facts about {topic}.",
    "Write a short paragraph about {topic}.",
    "What are the pros and cons of {topic}?",
    "How would you explain {topic} to a ten-year-old?",
    "What is the history of {topic}, in brief?",
    "List five questions a student might ask about {topic}, with short answers.",
    "Write a haiku about {topic}.",
)
DOCS_TEMPLATES = (
    "Explain this part of the Python documentation in plain words:\n\n{text}",
    "Summarize the following passage from the Python reference, then give a short example:\n\n{text}",
)
WRITE_TEMPLATES = (
    "Write a Python function `{signature}` that does the following:\n{doc}",
    "Implement `{signature}` in Python. {doc}",
)

# operator swaps that plant a plausible bug (the first one found in the code is applied)
_BUGS = ((" <= ", " < "), (" >= ", " > "), (" == ", " != "), (" + 1", " - 1"), (" - 1", " + 1"),
         (" and ", " or "), (" < ", " <= "), (" > ", " >= "), ("return True", "return False"))


@dataclass(frozen=True)
class FunctionSample:
    module: str  # dotted module name, e.g. "json.decoder"
    name: str
    signature: str  # "name(a, b=1)"
    source: str  # the whole def, dedented
    doc: str
    annotated: bool  # has any annotation already


def stdlib_modules() -> list[Path]:
    root = Path(sysconfig.get_paths()["stdlib"])
    skip = {"site-packages", "test", "tests", "idle_test", "lib2to3"}
    return sorted(p for p in root.rglob("*.py") if not skip & set(p.relative_to(root).parts))


def stdlib_functions(files: list[Path] | None = None) -> list[FunctionSample]:
    """Every function or method of the stdlib with a docstring and a source that fits MAX_SOURCE_CHARS."""
    root = Path(sysconfig.get_paths()["stdlib"])
    out: list[FunctionSample] = []
    for path in files if files is not None else stdlib_modules():
        try:
            text = path.read_text(encoding="utf-8")
            tree = ast.parse(text)
        except (SyntaxError, UnicodeDecodeError, ValueError, OSError):
            continue
        module = ".".join(path.relative_to(root).with_suffix("").parts) if path.is_relative_to(root) else path.stem
        lines = text.splitlines()
        for node in ast.walk(tree):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or node.name.startswith("__"):
                continue
            doc = ast.get_docstring(node)
            if not doc or len(doc) < MIN_DOC_CHARS or node.end_lineno is None:
                continue
            # by line numbers: ast.get_source_segment re-splits the whole file per call (minutes over the stdlib)
            source = _dedent(lines[node.lineno - 1: node.end_lineno], node.col_offset)
            if len(source) > MAX_SOURCE_CHARS:
                continue
            args = node.args
            annotated = node.returns is not None or any(
                a.annotation is not None for a in [*args.posonlyargs, *args.args, *args.kwonlyargs])
            out.append(FunctionSample(module=module, name=node.name, signature=f"{node.name}({ast.unparse(args)})",
                                      source=source, doc=doc.strip(), annotated=annotated))
    return out


def _dedent(lines: list[str], col: int) -> str:
    """The def's lines with its own indentation removed (continuation lines indented less are kept)."""
    return "\n".join(line[col:] if line[:col].strip() == "" else line for line in lines)


def _first_paragraph(doc: str) -> str:
    return doc.split("\n\n")[0].strip()


def _without_docstring(sample: FunctionSample) -> str | None:
    tree = ast.parse(sample.source)
    fn = tree.body[0]
    if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) or len(fn.body) < 2:
        return None
    first = fn.body[0]
    lines = sample.source.splitlines()
    kept = lines[: first.lineno - 1] + lines[first.end_lineno:]
    return "\n".join(kept)


def _completion_head(sample: FunctionSample) -> str | None:
    """``def ...:`` plus its docstring: the function's body is left to the model, as in HumanEval."""
    tree = ast.parse(sample.source)
    fn = tree.body[0]
    if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) or len(fn.body) < 2:
        return None
    lines = sample.source.splitlines()
    return "\n".join(lines[: fn.body[0].end_lineno]) + "\n"


def _planted_bug(source: str, rng: random.Random) -> str | None:
    body = source.split("\n", 1)[1] if "\n" in source else ""
    candidates = [(a, b) for a, b in _BUGS if a in body]
    if not candidates:
        return None
    a, b = rng.choice(candidates)
    return source.split("\n", 1)[0] + "\n" + body.replace(a, b, 1)


def docs_passages() -> list[str]:
    """Passages of the Python reference (``pydoc_data.topics``), cut at paragraph boundaries."""
    try:
        from pydoc_data.topics import topics
    except ImportError:  # a trimmed interpreter without pydoc_data
        return []
    passages = []
    for key in sorted(topics):
        chunk = ""
        for para in re.split(r"\n\s*\n", topics[key].strip()):  # paragraphs, gathered up to ~1000 characters
            if chunk and len(chunk) + len(para) > 1000:
                if len(chunk) >= 200:
                    passages.append(chunk)
                chunk = ""
            chunk = f"{chunk}\n\n{para}" if chunk else para
        if 200 <= len(chunk) <= 1200:
            passages.append(chunk)
    return passages


def _chat(text: str, kind: str, source: str) -> dict:
    return {"kind": kind, "source": source, "messages": [{"role": "user", "content": text}]}


def _code_block(code: str) -> str:
    return f"```python\n{code}\n```"


def _make(kind: str, rng: random.Random, functions: list[FunctionSample], passages: list[str]) -> dict | None:
    if kind == "general":
        topic = rng.choice(GENERAL_TOPICS)
        return _chat(rng.choice(GENERAL_TEMPLATES).format(topic=topic), kind, f"topic:{topic}")
    if kind == "docs":
        if not passages:
            return None
        return _chat(rng.choice(DOCS_TEMPLATES).format(text=rng.choice(passages)), kind, "pydoc_data.topics")
    f = rng.choice(functions)
    where = f"{f.module}.{f.name}"
    if kind == "write":
        return _chat(rng.choice(WRITE_TEMPLATES).format(signature=f.signature, doc=_first_paragraph(f.doc)),
                     kind, where)
    if kind == "explain":
        return _chat(f"Explain what this Python function does:\n\n{_code_block(f.source)}", kind, where)
    if kind == "document":
        code = _without_docstring(f)
        return None if code is None else _chat(
            f"Write a docstring for this Python function:\n\n{_code_block(code)}", kind, where)
    if kind == "type_hints":
        if f.annotated:
            return None
        return _chat(f"Add type hints to this Python function:\n\n{_code_block(f.source)}", kind, where)
    if kind == "fix":
        buggy = _planted_bug(_without_docstring(f) or f.source, rng)
        return None if buggy is None else _chat(
            f"This Python function has a bug. Find it and give the fixed code:\n\n{_code_block(buggy)}", kind, where)
    if kind == "complete":
        head = _completion_head(f)
        return None if head is None else {"kind": kind, "source": where, "prompt": head}
    raise ValueError(f"unknown prompt kind {kind!r}")


def build_prompts(count: int, seed: int = 0, functions: list[FunctionSample] | None = None,
                  weights: dict[str, float] | None = None) -> list[dict]:
    """``count`` prompt records, kinds drawn by ``weights`` (default :data:`KIND_WEIGHTS`), reproducibly."""
    if count <= 0:
        raise ValueError(f"count must be positive, got {count}")
    weights = dict(KIND_WEIGHTS if weights is None else weights)
    functions = stdlib_functions() if functions is None else functions
    if not functions:
        raise ValueError("no standard-library function with a docstring was found to build prompts from")
    passages = docs_passages()
    rng = random.Random(seed)
    kinds, probs = list(weights), list(weights.values())
    records, seen = [], set()
    attempts = 0
    while len(records) < count:
        attempts += 1
        if attempts > 50 * count:
            raise ValueError(f"could only build {len(records)} distinct prompts of the {count} asked for")
        record = _make(rng.choices(kinds, probs)[0], rng, functions, passages)
        if record is None:
            continue
        key = json.dumps(record.get("messages", record.get("prompt")))
        if key in seen:
            continue
        seen.add(key)
        records.append(record)
    return records


def write_prompts(path: Path, records: list[dict]) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for record in records:
            f.write(json.dumps(record, ensure_ascii=False) + "\n")
