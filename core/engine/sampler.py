"""Sampling the next token of plain (non-speculative) rows, per request."""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from hyspec.engine.sequence import Sequence
from hyspec.ops.sampling import SamplingTensors, greedy, process_logits

if TYPE_CHECKING:
    from hyspec.ops import OpTable


def sample_next_tokens(logits: torch.Tensor, seqs: list[Sequence], ops: "OpTable") -> list[int]:
    """``logits [R, V]`` (row r belongs to ``seqs[r]``) -> one token per row.

    Greedy rows take the argmax; the others sample from the processed
    distribution (temperature, top-k, top-p, min-p) with their own generator,
    so a seeded request draws the same numbers whatever shares its batch.
    The draw is the op table's ``sample`` (the engine passes its backend's table).
    """
    if all(s.params.greedy for s in seqs):
        return greedy(logits).tolist()
    st = SamplingTensors.from_params([s.params for s in seqs], device=logits.device)
    probs = process_logits(logits, st.temperature, st.top_k, st.top_p, st.min_p)
    return ops.sample(probs, [s.generator for s in seqs]).tolist()
