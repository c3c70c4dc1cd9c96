"""Presence, frequency and repetition penalties, as vLLM applies them.

vLLM (``vllm/model_executor/layers/utils.py: apply_penalties``, v0.32): the repetition penalty
divides a positive logit (multiplies a negative one) of every token seen in the prompt *or*
the output; then ``logit -= frequency * count_in_output`` and ``logit -= presence *
(count_in_output > 0)``.  Presence and frequency count the output only.

Under speculation the output a row sees is the committed output followed by the row's draft
path, so the counts of a verified position include the earlier drafts on its path.
"""
from __future__ import annotations

from collections import Counter
from typing import Sequence

import torch


class PenaltyProcessor:
    """One request's penalties; its state is the committed output's token counts.

    Only the tokens of the prompt and the output are touched: every row gets the committed output's
    penalties on those columns, then the few (row, token) entries its draft path adds are recomputed
    from the raw logit with the row's own count -- O(rows x seen tokens), not O(rows x vocabulary).
    """

    def __init__(self, prompt_token_ids: Sequence[int], vocab_size: int, device: torch.device, *,
                 presence: float, frequency: float, repetition: float):
        self.presence, self.frequency, self.repetition = float(presence), float(frequency), float(repetition)
        # vLLM multiplies by fp32 1 / penalty for positive logits (scaling = where(x > 0, 1 / p, p))
        self.inverse = float(torch.tensor(self.repetition, dtype=torch.float32).reciprocal())
        self.device = device
        self.counts = torch.zeros(vocab_size, dtype=torch.float32, device=device)  # output token counts
        self.subtract = torch.zeros(vocab_size, dtype=torch.float32, device=device)  # frequency x count + presence
        self.seen = set(prompt_token_ids)  # prompt and output tokens: the columns any penalty touches
        self._columns: torch.Tensor | None = None

    def _scaled(self, x: torch.Tensor) -> torch.Tensor:
        if self.repetition == 1.0:
            return x
        return x * torch.where(x > 0, self.inverse, self.repetition)

    def process(self, paths: Sequence[Sequence[int]], logits: torch.Tensor) -> None:
        extra = Counter((j, t) for j, path in enumerate(paths) for t in path)  # (row, token) -> count on the path
        if extra:
            rows = torch.tensor([j for j, _ in extra], dtype=torch.int64, device=logits.device)
            cols = torch.tensor([t for _, t in extra], dtype=torch.int64, device=logits.device)
            raw = logits[rows, cols].float()  # before the committed output's penalties below change them
        if self.seen:
            if self._columns is None:
                self._columns = torch.tensor(sorted(self.seen), dtype=torch.int64, device=self.device)
            index = self._columns.to(logits.device)
            part = self._scaled(logits[:, index].float()) - self.subtract[index].to(logits.device)
            logits[:, index] = part.to(logits.dtype)
        if extra:  # a token on the row's path is in the output there: repetition applies, its count grows
            count = self.counts.to(logits.device)[cols] + torch.tensor(list(extra.values()), dtype=torch.float32,
                                                                       device=logits.device)
            value = self._scaled(raw) - self.frequency * count - self.presence
            logits[rows, cols] = value.to(logits.dtype)

    def allowed_prefix(self, path: Sequence[int]) -> int:
        return len(path)  # a penalty lowers a logit, it never forbids a token

    def commit(self, tokens: Sequence[int]) -> None:
        if not tokens:
            return
        for token, n in Counter(tokens).items():
            self.counts[token] += n
            self.subtract[token] = self.frequency * self.counts[token] + self.presence
            if token not in self.seen:
                self.seen.add(token)
                self._columns = None
