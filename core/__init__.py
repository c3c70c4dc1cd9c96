"""hyspec: a lossless speculative-decoding runtime.

The public API is imported lazily so that ``import hyspec`` is cheap and works
on a bare CPU box with only the core dependencies installed::

    from hyspec import LLM, SamplingParams
    llm = LLM()                                   # SmolLM2-135M-Instruct (the default)
    out = llm.generate(["def add(a, b):"], SamplingParams(max_tokens=32))
"""
from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# public name -> module that defines it
_LAZY = {
    "LLM": "hyspec.engine.llm",
    "SamplingParams": "hyspec.engine.sampling_params",
    "StructuredOutputsParams": "hyspec.structured.params",
    "RequestOutput": "hyspec.engine.outputs",
    "CompletionOutput": "hyspec.engine.outputs",
    "default_model": "hyspec.assets",
    "default_drafter": "hyspec.assets",
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'hyspec' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
