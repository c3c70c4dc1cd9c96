"""Sampling the next token of plain (non-speculative) rows, per request."""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from hyspec.engine.sequence import Sequence
from hyspec.ops.sampling import SamplingTensors, greedy, process_logits
from hyspec.seam.processors import apply_processors

if TYPE_CHECKING:
    from hyspec.ops import OpTable


def apply_controls(logits: torch.Tensor, seqs: list[Sequence],
                   paths: list[list[int]] | None = None) -> torch.Tensor:
    """``logits [R, V]`` with each row's request processors applied (fp32 copy); ``logits`` itself
    when no row's request has any.  Row r is the position after ``seqs[r]``'s committed output
    followed by ``paths[r]`` (default: nothing, the next token of a plain step)."""
    if not any(s.processors for s in seqs):
        return logits
    out = logits.float().clone()
    for r, seq in enumerate(seqs):
        if seq.processors:
            apply_processors(seq.processors, [[] if paths is None else paths[r]], out[r:r + 1])
    return out


def sample_next_tokens(logits: torch.Tensor, seqs: list[Sequence], ops: "OpTable") -> list[int]:
    """``logits [R, V]`` (row r belongs to ``seqs[r]``, its processors already applied:
    :func:`apply_controls`) -> one token per row.

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
