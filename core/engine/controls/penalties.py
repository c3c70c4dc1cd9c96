"""Presence, frequency and repetition penalties, as vLLM applies them.

vLLM (``vllm/model_executor/layers/utils.py: apply_penalties``, v0.32): the repetition penalty
divides a positive logit (multiplies a negative one) of every token seen in the prompt *or*
the output; then ``logit -= frequency * count_in_output`` and ``logit -= presence *
(count_in_output > 0)``.  Presence and frequency count the output only.

Under speculation the output a row sees is the committed output followed by the row's draft
path, so the counts of a verified position include the earlier drafts on its path.
"""
from __future__ import annotations

from typing import Sequence

import torch


class PenaltyProcessor:
    """One request's penalties; its state is the committed output's token counts."""

    def __init__(self, prompt_token_ids: Sequence[int], vocab_size: int, device: torch.device, *,
                 presence: float, frequency: float, repetition: float):
        self.presence, self.frequency, self.repetition = float(presence), float(frequency), float(repetition)
        self.vocab_size = vocab_size
        self.prompt_mask = torch.zeros(vocab_size, dtype=torch.bool, device=device)
        if prompt_token_ids:
            self.prompt_mask[torch.as_tensor(list(prompt_token_ids), dtype=torch.int64, device=device)] = True
        self.counts = torch.zeros(vocab_size, dtype=torch.float32, device=device)  # output token counts

    def process(self, paths: Sequence[Sequence[int]], logits: torch.Tensor) -> None:
        counts = self.counts.expand(len(paths), -1).clone()  # [P, V]
        rows = [j for j, path in enumerate(paths) for _ in path]
        if rows:
            cols = [t for path in paths for t in path]
            device = counts.device
            counts.index_put_((torch.tensor(rows, device=device), torch.tensor(cols, device=device)),
                              torch.ones(len(rows), device=device), accumulate=True)
        seen = counts > 0
        x = logits.float()
        if self.repetition != 1.0:
            penalised = seen | self.prompt_mask
            factor = torch.where(x > 0, 1.0 / self.repetition, self.repetition)
            x = torch.where(penalised, x * factor, x)
        if self.frequency:
            x = x - self.frequency * counts
        if self.presence:
            x = x - self.presence * seen.float()
        logits.copy_(x)

    def allowed_prefix(self, path: Sequence[int]) -> int:
        return len(path)  # a penalty lowers a logit, it never forbids a token

    def commit(self, tokens: Sequence[int]) -> None:
        if tokens:
            index = torch.as_tensor(list(tokens), dtype=torch.int64, device=self.counts.device)
            self.counts.index_put_((index,), torch.ones(len(tokens), device=self.counts.device), accumulate=True)
