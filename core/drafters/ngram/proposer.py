"""``ngram``: prompt lookup decoding (no weights).

Find the most recent earlier occurrence of the sequence's last n tokens
(n from ``prompt_lookup_max`` down to ``prompt_lookup_min``, as vLLM does) and
propose the tokens that followed it.  The drafts are deterministic, so the
verifier treats q as one-hot: at temperature 0 a draft is accepted iff it is
the argmax; above it, with probability p(x) (lossless either way).
"""
from __future__ import annotations

import numpy as np

from hyspec.ops.sampling import SamplingTensors
from hyspec.seam.proposer import DraftRequest, Proposer
from hyspec.seam.tree import DraftTree


def match_length(tokens: np.ndarray, n_min: int, n_max: int) -> int:
    """The longest n in [n_min, n_max] whose last-n-token pattern occurs earlier with a token after it; 0: none."""
    length = len(tokens)
    for n in range(min(n_max, length - 1), n_min - 1, -1):
        windows = np.lib.stride_tricks.sliding_window_view(tokens[: length - 1], n)
        if (windows == tokens[length - n:]).all(axis=1).any():
            return n
    return 0


def find_continuation(tokens: np.ndarray, n_min: int, n_max: int, k: int) -> list[int]:
    """Up to ``k`` tokens that followed the latest earlier match of the last n tokens (longest n first)."""
    length = len(tokens)
    for n in range(min(n_max, length - 1), n_min - 1, -1):
        pattern = tokens[length - n:]
        # Every window that starts early enough to have at least one token after it.
        windows = np.lib.stride_tricks.sliding_window_view(tokens[: length - 1], n)
        hits = np.flatnonzero((windows == pattern).all(axis=1))
        if hits.size:
            s = int(hits[-1])  # the latest match
            return tokens[s + n: s + n + k].tolist()
    return []


class NgramProposer(Proposer):
    method = "ngram"
    drafts_rows_independently = True

    def __init__(self, prompt_lookup_min: int, prompt_lookup_max: int, max_tokens: int, vocab_size: int):
        self.n_min, self.n_max = prompt_lookup_min, prompt_lookup_max
        self.max_tokens = max_tokens
        self.vocab_size = vocab_size
        self._arrays: dict[str, np.ndarray] = {}

    def max_budget(self) -> int:
        return self.max_tokens

    def propose(self, requests: list[DraftRequest], sampling: SamplingTensors) -> list[DraftTree | None]:
        out: list[DraftTree | None] = []
        for req in requests:
            tokens = self._tokens(req.seq)
            follow = find_continuation(tokens, self.n_min, self.n_max, min(req.budget, self.max_tokens))
            out.append(DraftTree.chain(req.seq.last_token, follow, vocab_size=self.vocab_size) if follow else None)
        return out

    def match_length(self, seq, cap: int) -> int:
        return match_length(self._tokens(seq), self.n_min, min(self.n_max, cap))

    def _tokens(self, seq) -> np.ndarray:
        """The history as an int array, grown in place rather than rebuilt every step."""
        arr = self._arrays.get(seq.request_id)
        n = len(seq.token_ids)
        if arr is None or len(arr) > n or (len(arr) and arr[-1] != seq.token_ids[len(arr) - 1]):
            arr = np.asarray(seq.token_ids, dtype=np.int64)
        elif len(arr) < n:
            arr = np.concatenate([arr, np.asarray(seq.token_ids[len(arr):], dtype=np.int64)])
        self._arrays[seq.request_id] = arr
        return arr

    def on_finish(self, seq) -> None:
        self._arrays.pop(seq.request_id, None)
