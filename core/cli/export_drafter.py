"""Write a hyspec drafter as vLLM loads it (dense safetensors, vLLM's config keys), checked against its target.

    hyspec export-drafter eagle3 OUT_DIR --target MODEL_DIR          # the committed SmolLM2 EAGLE-3 head
    hyspec export-drafter draft_model OUT_DIR --target MODEL_DIR     # the committed SmolLM2 draft model
    hyspec export-drafter eagle3 OUT_DIR --drafter DIR --target MODEL_DIR --dtype bfloat16
    hyspec export-drafter draft_model OUT_DIR --target MODEL_DIR --head-dim 64     # for vLLM's CPU build

then, in vLLM (0.32):  LLM(MODEL_DIR, speculative_config={"method": "eagle3", "model": "OUT_DIR",
"num_speculative_tokens": 3}), or "method": "draft_model".

--target is the model vLLM will serve (a Hugging Face directory, e.g. from `hyspec export-hf`; a GGUF is read
for its shape).  Default: the default model's GGUF.  A drafter trained for another target is refused, naming
both targets' vocabulary and hidden size.  The draft model's directory gets the target's tokenizer.
"""
from __future__ import annotations

import argparse

from hyspec.assets import default_drafter, default_model

# hyspec.drafters.export_vllm imports torch, which the CLI must not do before the probe's autoload check
# (tests/test_probe_npu.py); these mirror its VLLM_METHODS and DTYPES keys (tests/drafters/test_export_vllm.py).
METHODS = ("draft_model", "eagle3")
DTYPE_NAMES = ("float32", "bfloat16", "float16")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("method", choices=METHODS, help="the drafter's method (vLLM's name is the same)")
    parser.add_argument("out", metavar="OUT_DIR", help="the directory to create (must not exist, or be empty)")
    parser.add_argument("--drafter", default=None, metavar="DIR",
                        help="the hyspec drafter directory (default: the one committed for the default model)")
    parser.add_argument("--target", default=None, metavar="MODEL_DIR|FILE.gguf",
                        help="the target vLLM will serve the drafter with (default: the default model's GGUF)")
    parser.add_argument("--head-dim", type=int, default=None, metavar="N",
                        help="draft_model: write the attention heads N wide, zero-padded (the same function; for "
                             "vLLM's CPU build, whose attention runs head sizes 32, 64, 80, ... but not the committed "
                             "draft model's 40: use 64 there).  vLLM-only: it relies on a partial rotary factor")
    parser.add_argument("--dtype", default="float32", choices=DTYPE_NAMES,
                        help="the written weights' dtype (default float32: int8-stored weights dequantized exactly)")


def run(args: argparse.Namespace) -> int:
    from hyspec.drafters.export_vllm import VLLM_METHODS, export_drafter

    drafter = args.drafter if args.drafter is not None else default_drafter(args.method)
    target = args.target if args.target is not None else default_model()
    out = export_drafter(args.method, drafter, target, args.out, args.dtype, args.head_dim)
    print(f"wrote {out} ({args.method} drafter from {drafter}, {args.dtype}, for target {target}); in vLLM: "
          f'speculative_config={{"method": "{VLLM_METHODS[args.method]}", "model": "{out}", '
          '"num_speculative_tokens": K}')
    return 0
