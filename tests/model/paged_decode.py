"""Drive a hyspec model over the paged cache without the engine (for model-level tests)."""
from __future__ import annotations

import torch

from hyspec.kv.pool import KVPool
from hyspec.kv.sequence_kv import SequenceKV
from hyspec.seam.forward import LAST_LOGITS, Feed, ModelRunner


def make_runner(model, pages: int = 64, block_size: int = 16):
    cfg = model.config
    dtype = model.embed_tokens.weight.dtype
    page = KVPool.page_bytes_for(cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim, dtype, block_size)
    pool = KVPool(pages, page)
    layout = pool.register("target", cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim, dtype, block_size)
    return pool, layout, ModelRunner(model, layout, torch.device("cpu"))


def greedy_paged(model, prompt: list[int], steps: int, block_size: int = 16):
    """Prefill then ``steps`` one-token decodes; returns (tokens, per-step logits [steps+1, V])."""
    pool, layout, runner = make_runner(model, block_size=block_size)
    kv = SequenceKV(pool, layout)
    kv.reserve(len(prompt) + steps + 1)
    out = runner.run([Feed(kv, list(prompt), 0, logits=LAST_LOGITS)])
    logits = [out.logits[0]]
    tokens = [int(out.logits[0].argmax())]
    for _ in range(steps):
        out = runner.run([Feed(kv, [tokens[-1]], kv.num_tokens)])
        logits.append(out.logits[0])
        tokens.append(int(out.logits[0].argmax()))
    return tokens, torch.stack(logits)
