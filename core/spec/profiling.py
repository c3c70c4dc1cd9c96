"""Start-up profile of the target step cost on the live backend (for the goodput controller)."""
from __future__ import annotations

import logging
import time
from typing import Any

import torch

from hyspec.engine.model_runner import NO_LOGITS, Feed
from hyspec.kv.sequence_kv import SequenceKV
from hyspec.spec.cost_model import CostModel

log = logging.getLogger(__name__)

CONTEXT = 16  # tokens of context per profiled sequence: attention cost is small next to weights here


def profile_cost_model(engine: Any, token_counts: tuple[int, ...] = (1, 2, 4, 8, 16)) -> CostModel:
    """Time one verification step for (batch, tokens) on a grid that fits the pool and the batch limit."""
    max_batch = engine.scheduler.config.max_num_seqs
    per_seq = CONTEXT + max(token_counts)
    fits = engine.pool.num_free * engine.layout.block_size // max(per_seq + engine.layout.block_size, 1)
    batch_sizes = tuple(b for b in (1, 2, 4, 8, 16, 32) if b <= max(1, min(max_batch, fits)))
    vocab = engine.config.vocab_size

    @torch.inference_mode()
    def measure(batch: int, tokens: int) -> float:
        kvs = [SequenceKV(engine.pool, engine.layout) for _ in range(batch)]
        try:
            for kv in kvs:
                kv.reserve(CONTEXT + tokens, reclaim=False)
            ids = torch.randint(0, vocab, (CONTEXT + tokens,)).tolist()
            engine.runner.run([Feed(kv, ids[:CONTEXT], 0, logits=NO_LOGITS) for kv in kvs])  # untimed context
            feeds = [Feed(kv, ids[CONTEXT:], CONTEXT) for kv in kvs]
            engine.backend.synchronize()
            t0 = time.perf_counter()
            engine.runner.run(feeds)
            engine.backend.synchronize()
            return time.perf_counter() - t0
        finally:
            for kv in kvs:
                kv.release()

    t0 = time.perf_counter()
    model = CostModel.profile(measure, batch_sizes=batch_sizes, token_counts=token_counts)
    log.info("profiled the target step cost in %.1fs: %s", time.perf_counter() - t0, model.coefficients())
    return model
