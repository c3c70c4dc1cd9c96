"""A GGUF model written as a Hugging Face directory: what vLLM, transformers and hyspec load as a "model dir".

vLLM's CPU build serves safetensors directories; hyspec's default model ships as a GGUF.  Comparing the two
engines "on the same weights" needs the GGUF's weights dequantized into such a directory, with its config
and tokenizer.  The conversion is transformers' own GGUF reader (maintained, and the one vLLM relies on for
GGUF configs): tensor names, llama.cpp's q/k row order undone, metadata to ``config.json``, the vocabulary
to ``tokenizer.json`` and the chat template to ``chat_template.jinja``.  Only the written layout is ours.

The directory is written beside ``out`` under a temporary name and renamed when complete, so an interrupted
export leaves no half-written model behind, and an existing directory is never overwritten.
"""
from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from hyspec.errors import HyspecError
from hyspec.model.staging import publish_staged_directory

DTYPES = ("float32", "bfloat16", "float16")


def export_hf(gguf_file: str | Path, out: str | Path, dtype: str = "float32") -> Path:
    """Write ``gguf_file``'s model to the new directory ``out`` (safetensors in ``dtype``); return ``out``."""
    src, dst = Path(gguf_file), Path(out)
    if dtype not in DTYPES:
        raise HyspecError(f"--dtype {dtype!r}: choose one of {', '.join(DTYPES)}")
    if not src.is_file() or src.suffix != ".gguf":
        raise HyspecError(f"{src}: not a .gguf file (export-hf converts a GGUF; a model directory is already one)")
    if dst.exists() and (not dst.is_dir() or any(dst.iterdir())):
        raise HyspecError(f"{dst} exists and is not an empty directory: choose a new one (nothing was written)")
    try:
        import torch
        from safetensors.torch import save_file
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError as exc:
        raise HyspecError(f"export-hf reads GGUF files with transformers ({exc.name} is missing): "
                          "pip install 'hyspec[bench]'") from None

    _refuse_what_transformers_drops(src)
    dst.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{dst.name}.", dir=dst.parent))
    try:
        tokenizer = AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name)
        model = AutoModelForCausalLM.from_pretrained(src.parent, gguf_file=src.name, dtype=getattr(torch, dtype))
        config = model.config
        tied = bool(getattr(config, "tie_word_embeddings", False))
        # save_pretrained refuses a model that came from a GGUF (it still carries the gguf quantization
        # config), so the tensors are written directly; a tied head is stored once, as HF checkpoints do.
        state = {name: t.contiguous() for name, t in model.state_dict().items()
                 if not (tied and name == "lm_head.weight")}
        save_file(state, str(staging / "model.safetensors"), metadata={"format": "pt"})
        if hasattr(config, "quantization_config"):
            del config.quantization_config  # the weights written are dense
        config.dtype = dtype
        config.save_pretrained(staging)
        if model.generation_config is not None:
            model.generation_config.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        publish_staged_directory(staging, dst)  # dst: absent or empty, checked above
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return dst


def _refuse_what_transformers_drops(src: Path) -> None:
    """transformers' GGUF reader drops llama.cpp's ``rope_freqs`` tensor (llama3 RoPE scaling, which the file
    keeps in no other form) and a llama file's sliding window: the written directory would be another model,
    so it is not written."""
    from hyspec.model.gguf_checkpoint import GGUFCheckpoint
    from hyspec.model.moe_config import MOE_MODEL_TYPES

    config = GGUFCheckpoint(src).hf_config()
    if config["model_type"] in MOE_MODEL_TYPES:
        raise HyspecError(f"{src.name} is a mixture-of-experts model ({config['model_type']}), which transformers' "
                          "GGUF reader does not convert (it reads a Mixtral file as a dense Llama and stops on Qwen "
                          "MoE expert shapes): nothing was written; serve the GGUF itself")
    if config.get("sliding_window"):
        raise HyspecError(f"{src.name} has a sliding attention window ({config['sliding_window']}), which "
                          "transformers' GGUF reader does not carry into the config: the exported directory would "
                          "attend in full, so nothing was written; serve the GGUF itself")
    if "rope_freq_factors" in config:
        raise HyspecError(f"{src.name} stores its RoPE scaling as llama.cpp's rope_freqs tensor (llama3 scaling), "
                          "which transformers' GGUF reader ignores: the exported directory would be wrong, so "
                          "nothing was written; use the model's Hugging Face release, or serve the GGUF itself")
