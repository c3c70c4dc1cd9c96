"""Requantize a GGUF with llama.cpp itself (llama-cpp-python's ``llama_model_quantize``), e.g. the default
model's Q4_1 file to Q4_K_M, the type most published GGUFs ship in.

Run it with the Python of a venv that has llama-cpp-python (../shared/tools/llamacpp-venv.sh builds one; it
is never part of hyspec's own set-up):

    $LLAMACPP_PY scripts/llamacpp_requantize.py SRC.gguf OUT.gguf --type Q4_K_M

The source may itself be quantized (``allow_requantize``): that is how the issue's figure was made, and it
gives the same tensor-type mix as a Q4_K_M made from the float weights (Q5_0 / Q4_K / Q6_K / Q8_0 for
SmolLM2-135M, whose 576-wide rows are not whole 256-weight super-blocks). Prints the tensor types written.
"""
from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

FTYPES = {"Q4_K_M": "LLAMA_FTYPE_MOSTLY_Q4_K_M", "Q5_K_M": "LLAMA_FTYPE_MOSTLY_Q5_K_M",
          "Q4_K_S": "LLAMA_FTYPE_MOSTLY_Q4_K_S", "Q6_K": "LLAMA_FTYPE_MOSTLY_Q6_K", "Q8_0": "LLAMA_FTYPE_MOSTLY_Q8_0"}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("src", type=Path)
    p.add_argument("out", type=Path)
    p.add_argument("--type", default="Q4_K_M", choices=sorted(FTYPES))
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args()
    try:
        import llama_cpp
    except ImportError:
        sys.exit("llama-cpp-python is not installed in this Python: run this with a llama.cpp venv's python")
    if not a.src.is_file():
        sys.exit(f"{a.src}: no such file")
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, FTYPES[a.type])
    params.allow_requantize = True
    params.nthread = a.threads
    rc = llama_cpp.llama_model_quantize(str(a.src).encode(), str(a.out).encode(), params)
    if rc != 0:
        sys.exit(f"llama_model_quantize returned {rc}")
    try:
        import gguf
        types = Counter(t.tensor_type.name for t in gguf.GGUFReader(str(a.out)).tensors)
        print(f"{a.out}: {dict(sorted(types.items()))} (llama-cpp-python {llama_cpp.__version__})")
    except ImportError:
        print(f"{a.out}: written (llama-cpp-python {llama_cpp.__version__}; install gguf to list its tensor types)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
