"""hyspec against transformers on the same checkpoint: greedy tokens and teacher-forced logits.

Both load the same file (a GGUF through transformers' ``gguf_file=``, which
dequantizes with its own code), in fp32.  For each prompt both decode greedily
for ``max_tokens`` (EOS ignored on both sides); then both score hyspec's whole
sequence in one forward, so the logits are compared at every generated
position, not only up to a first divergence.  Used by
``scripts/check_gguf_numerics.py`` (the full run) and the default test suite
(a short one).
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from hyspec.bench.prompts import CHAT_PROMPTS  # chat turns: what the default model is asked in practice
from hyspec import LLM, SamplingParams

#: Code heads (not HumanEval, the benchmark).
CODE_PROMPTS = (
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "import os\n\n\ndef list_python_files(root):\n",
    "class Stack:\n    def __init__(self):\n",
    "def binary_search(items, target):\n",
)


def load_transformers(path: Path, dtype: torch.dtype = torch.float32, device: Any = "cpu"):
    """transformers' model for ``path`` (a directory, or a GGUF through ``gguf_file=``), generating exactly
    ``max_new_tokens`` (no EOS stop), without its loading progress bars."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    path = Path(path)
    if path.suffix.lower() == ".gguf":
        import transformers.modeling_gguf_pytorch_utils as gguf_utils

        bar = getattr(gguf_utils, "tqdm", None)
        gguf_utils.tqdm = lambda iterable, **_: iterable  # its per-tensor bar ignores disable_progress_bar()
        try:
            model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=dtype)
        finally:
            if bar is not None:
                gguf_utils.tqdm = bar
    else:
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype)
    # older transformers name the argument torch_dtype and ignore `dtype`: cast to be sure
    model = model.to(device=device, dtype=dtype).eval()
    model.generation_config.eos_token_id = None  # exactly max_new_tokens, as on hyspec's side
    return model


def prompt_ids(tokenizer, num_chat: int, num_code: int) -> list[tuple[str, list[int]]]:
    out = []
    for text in CHAT_PROMPTS[:num_chat]:
        rendered = tokenizer.apply_chat_template([{"role": "user", "content": text}])
        out.append(("chat: " + text, tokenizer.encode(rendered, add_special_tokens=False)))
    for text in CODE_PROMPTS[:num_code]:
        out.append(("code: " + text.splitlines()[0], tokenizer.encode(text)))
    return out


def compare(path: str | Path, num_chat: int = 4, num_code: int = 4, max_tokens: int = 256) -> dict[str, Any]:
    """Greedy tokens and logits of hyspec vs transformers in fp32; a JSON-ready report."""
    path = Path(path)
    t0 = time.perf_counter()
    llm = LLM(str(path), dtype="float32")
    hf = load_transformers(path)
    load_s = time.perf_counter() - t0
    prompts = prompt_ids(llm.tokenizer, num_chat, num_code)
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    rows = []
    for name, ids in prompts:
        ours = llm.generate([ids], params)[0].outputs[0].token_ids
        with torch.no_grad():
            x = torch.tensor([ids])
            theirs = hf.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=max_tokens, min_new_tokens=max_tokens,
                                 do_sample=False, pad_token_id=0)[0, len(ids):].tolist()
            full = torch.tensor([ids + ours])
            hf_logits = hf(full).logits[0, len(ids) - 1:-1].float()
            model = llm.engine.model
            hy_logits = model.compute_logits(model.forward_dense(full).hidden[0])[len(ids) - 1:-1]
        diff = (hy_logits - hf_logits).abs()
        first = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), None)
        row = {"prompt": name, "prompt_tokens": len(ids), "generated": len(ours),
               "token_identical": ours == theirs, "first_divergence": first,
               "max_abs_logit_diff": diff.max().item(), "mean_abs_logit_diff": diff.mean().item(),
               "max_abs_logit": hf_logits.abs().max().item(),
               "text": llm.tokenizer.decode(ours[:64])}
        if first is not None:  # how close the two best logits were there (a near-tie or a real error)
            top2 = hf_logits[first].topk(2).values
            row["margin_at_divergence"] = (top2[0] - top2[1]).item()
        rows.append(row)
    return {
        "model": str(path), "dtype": "float32", "max_tokens": max_tokens, "load_seconds": load_s,
        "prompts": len(rows), "positions_compared": sum(r["generated"] for r in rows),
        "all_token_identical": all(r["token_identical"] for r in rows),
        "max_abs_logit_diff": max(r["max_abs_logit_diff"] for r in rows),
        "rows": rows,
    }
