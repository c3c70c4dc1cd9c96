"""The controls that add to or forbid tokens: ``logit_bias``, ``allowed_token_ids``, ``bad_words``,
``min_tokens`` -- each with vLLM's semantics (``vllm/v1/sample``, v0.32).

A forbidden token's logit becomes ``-inf``; the ones that forbid also answer
:meth:`allowed_prefix`, so a draft through a forbidden token is cut before the target runs.
"""
from __future__ import annotations

from typing import Sequence

import torch

NEG_INF = float("-inf")


class LogitBiasProcessor:
    """Adds ``bias[token]`` to that token's logit at every position (stateless)."""

    def __init__(self, bias: dict[int, float], device: torch.device):
        self.ids = torch.tensor(list(bias), dtype=torch.int64, device=device)
        self.values = torch.tensor(list(bias.values()), dtype=torch.float32, device=device)

    def process(self, paths: Sequence[Sequence[int]], logits: torch.Tensor) -> None:
        logits[:, self.ids] += self.values.to(logits.dtype)

    def allowed_prefix(self, path: Sequence[int]) -> int:
        return len(path)

    def commit(self, tokens: Sequence[int]) -> None:
        pass


class AllowedTokensProcessor:
    """Every token outside ``allowed_token_ids`` is masked (stateless)."""

    def __init__(self, allowed: Sequence[int], vocab_size: int, device: torch.device):
        self.allowed = frozenset(allowed)
        self.blocked = torch.ones(vocab_size, dtype=torch.bool, device=device)
        self.blocked[torch.tensor(sorted(self.allowed), dtype=torch.int64, device=device)] = False

    def process(self, paths: Sequence[Sequence[int]], logits: torch.Tensor) -> None:
        logits.masked_fill_(self.blocked, NEG_INF)

    def allowed_prefix(self, path: Sequence[int]) -> int:
        return next((i for i, t in enumerate(path) if t not in self.allowed), len(path))

    def commit(self, tokens: Sequence[int]) -> None:
        pass


class BadWordsProcessor:
    """vLLM's ``bad_words``: a word is a token sequence; its last token is banned wherever the output
    (committed tokens, then the row's draft path) ends with the rest of it.  One-token words are banned
    everywhere.  Only the output counts, not the prompt (vLLM's ``past_tokens_ids``)."""

    def __init__(self, words: Sequence[Sequence[int]]):
        self.words = [tuple(w) for w in words if w]
        self.longest = max((len(w) for w in self.words), default=1)
        self.tail: list[int] = []  # the last ``longest - 1`` committed output tokens: all a prefix can reach

    def banned(self, past: Sequence[int]) -> set[int]:
        out = set()
        for word in self.words:
            prefix = word[:-1]
            if not prefix or (len(past) >= len(prefix) and tuple(past[len(past) - len(prefix):]) == prefix):
                out.add(word[-1])
        return out

    def process(self, paths: Sequence[Sequence[int]], logits: torch.Tensor) -> None:
        rows, cols = [], []
        for j, path in enumerate(paths):
            for token in self.banned(self.tail + list(path)):
                rows.append(j)
                cols.append(token)
        if rows:
            device = logits.device
            logits[torch.tensor(rows, device=device), torch.tensor(cols, device=device)] = NEG_INF

    def allowed_prefix(self, path: Sequence[int]) -> int:
        past = list(self.tail)
        for i, token in enumerate(path):
            if token in self.banned(past):
                return i
            past.append(token)
        return len(path)

    def commit(self, tokens: Sequence[int]) -> None:
        keep = self.longest - 1
        self.tail = (self.tail + list(tokens))[-keep:] if keep else []


class MinTokensProcessor:
    """vLLM's ``min_tokens``: EOS and ``stop_token_ids`` are masked while fewer than ``min_tokens``
    output tokens precede the position (the committed output plus the row's draft path)."""

    def __init__(self, min_tokens: int, stop_ids: Sequence[int], device: torch.device):
        self.min_tokens = min_tokens
        self.stop_ids = frozenset(stop_ids)
        self.ids = torch.tensor(sorted(self.stop_ids), dtype=torch.int64, device=device)
        self.num_output = 0

    def process(self, paths: Sequence[Sequence[int]], logits: torch.Tensor) -> None:
        if not self.stop_ids:
            return
        rows = [j for j, path in enumerate(paths) if self.num_output + len(path) < self.min_tokens]
        if rows:
            index = torch.tensor(rows, dtype=torch.int64, device=logits.device)
            logits[index[:, None], self.ids[None, :]] = NEG_INF

    def allowed_prefix(self, path: Sequence[int]) -> int:
        for i, token in enumerate(path):
            if self.num_output + i < self.min_tokens and token in self.stop_ids:
                return i
        return len(path)

    def commit(self, tokens: Sequence[int]) -> None:
        self.num_output += len(tokens)
