"""A grammar as a :class:`~hyspec.seam.processors.TokenProcessor`: lossless under speculation.

Plain constrained decoding samples each token from the target's logits with every token
the grammar forbids after the output so far set to -inf.  Under speculation one step
verifies several positions, each after the committed output plus a draft path; this
processor masks each verified row with the matcher state *after that row's path*
(consume the path, compute the mask, roll back), so the verifier compares against exactly
the law plain constrained decoding samples from at that position.  Greedy verification
then reproduces plain constrained decoding's tokens, and rejection sampling its law.

Drafts the grammar forbids are cut before verification (:meth:`allowed_prefix`): the
target could never accept them (their masked probability is 0), so cutting them loses
nothing and saves verifying positions past them.

End of sequence is the matcher's own rule: an EOS token is allowed exactly where the
mask allows it (the grammar accepts the output so far); once the grammar is complete the
mask allows only EOS, so the next token ends the output.  EOS is never consumed by the
matcher (llguidance refuses it once stopped): the processor remembers it instead.

Masks are computed by llguidance straight into a preallocated bitmask (one bit per token,
``LLMatcher.unsafe_compute_mask_ptr``, what its ``fill_next_token_bitmask`` wraps) and
applied to all masked rows at once.  On the CPU the bitmask is unpacked and applied with
numpy, in the calling thread: a handful of tiny torch ops per row, each dispatched to the
intra-op thread pool, cost more than llguidance's mask itself on a busy machine (55 ms a
token against 0.7 ms, measured with other jobs on both cores).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Collection, Sequence

import numpy as np
import torch

from hyspec.errors import HyspecError

if TYPE_CHECKING:
    import llguidance


class GrammarViolation(HyspecError):
    """The engine committed a token the grammar forbids: a wiring bug, never the model's choice."""


class GrammarProcessor:
    """One output sequence's grammar state; ``commit`` advances it, nothing else changes it."""

    def __init__(self, matcher: "llguidance.LLMatcher", eos_ids: Collection[int], vocab_size: int):
        self._matcher = matcher
        self._eos = frozenset(eos_ids)
        self._vocab_size = vocab_size
        self._ended = False  # an EOS was committed: nothing may follow
        self._looked_ahead: list[int] = []  # tokens consumed past the committed state by process()
        # llguidance's layout: 32 tokens per int32 word, token t at bit t % 32 of word t // 32; grown to a step's rows
        self._bitmask = np.empty((1, (vocab_size + 31) // 32), dtype=np.int32)

    # -- look-ahead helpers (each leaves the matcher at the committed state) --------------------

    def _move_to(self, path: Sequence[int]) -> bool:
        """Consume ``path`` (non-EOS tokens) on top of the committed state, reusing what the previous row
        consumed; False when the grammar forbids some token of it (the matcher then stops at the valid part)."""
        common = 0
        for a, b in zip(self._looked_ahead, path):
            if a != b:
                break
            common += 1
        if common < len(self._looked_ahead):
            self._matcher.rollback(len(self._looked_ahead) - common)
            del self._looked_ahead[common:]
        rest = list(path[common:])
        if not rest:
            return True
        valid = self._matcher.validate_tokens(rest)
        if valid:
            self._consume(rest[:valid])
            self._looked_ahead.extend(rest[:valid])
        return valid == len(rest)

    def _back_to_committed(self) -> None:
        if self._looked_ahead:
            self._matcher.rollback(len(self._looked_ahead))
            self._looked_ahead.clear()

    def _consume(self, tokens: list[int]) -> None:
        if not self._matcher.consume_tokens(tokens):  # validated first: failing here is llguidance's bug
            raise GrammarViolation(f"the grammar matcher refused tokens it validated: {self._matcher.get_error()}")

    def _fill_mask(self, index: int) -> np.ndarray:
        """Bitmask row ``index`` := the tokens the grammar allows next at the matcher's current state."""
        if index >= len(self._bitmask):
            grown = np.empty((max(index + 1, 2 * len(self._bitmask)), self._bitmask.shape[1]), dtype=np.int32)
            grown[:len(self._bitmask)] = self._bitmask
            self._bitmask = grown
        row = self._bitmask[index]
        self._matcher.unsafe_compute_mask_ptr(row.ctypes.data, row.nbytes)
        return row

    def _allows(self, token: int) -> bool:
        """Whether the grammar allows ``token`` next, at the matcher's current state."""
        return bool((int(self._fill_mask(0)[token >> 5]) >> (token & 31)) & 1)

    def _forbidden(self, rows: int) -> np.ndarray:
        """``[rows, V]`` bool: the tokens bitmask rows ``0..rows-1`` forbid."""
        bits = np.unpackbits(self._bitmask[:rows].view(np.uint8), axis=1, bitorder="little")
        return bits[:, :self._vocab_size] == 0

    # -- TokenProcessor -------------------------------------------------------------------------

    def process(self, paths: Sequence[Sequence[int]], logits: torch.Tensor) -> None:
        """``logits [P, V]``: row j masked by the grammar after the committed output and ``paths[j]``.

        A row whose path the grammar forbids, or that follows an EOS, is left as it is: the verifier can
        never reach it (its path has probability 0 under the masked rows before it)."""
        rows: list[int] = []  # logits row of each filled bitmask row
        try:
            for row, path in enumerate(paths):
                if self._ended or any(t in self._eos for t in path):
                    continue
                if self._move_to(path):
                    self._fill_mask(len(rows))
                    rows.append(row)
        finally:
            self._back_to_committed()
        if rows:
            _mask_rows(logits, rows, self._forbidden(len(rows)))

    def allowed_prefix(self, path: Sequence[int]) -> int:
        """How many leading draft tokens the grammar allows (an allowed EOS counts and ends the path)."""
        if self._ended:
            return 0
        first_eos = next((i for i, t in enumerate(path) if t in self._eos), len(path))
        valid = self._matcher.validate_tokens(list(path[:first_eos])) if first_eos else 0
        if valid < first_eos or first_eos == len(path):
            return valid
        try:  # every token before the EOS is allowed: the EOS is, where the grammar accepts
            self._move_to(path[:first_eos])
            return first_eos + 1 if self._allows(path[first_eos]) else first_eos
        finally:
            self._back_to_committed()

    def commit(self, tokens: Sequence[int]) -> None:
        """Advance by the tokens this step emitted; a token the grammar forbids raises GrammarViolation."""
        self._back_to_committed()
        for i, token in enumerate(tokens):
            if self._ended:
                raise GrammarViolation(f"token {token} committed after end of sequence under a grammar")
            if token in self._eos:
                if not self._allows(token):
                    raise GrammarViolation(f"end of sequence committed where the grammar is incomplete")
                self._ended = True
            elif self._matcher.validate_tokens([token]) == 1:
                self._consume([token])
            else:
                raise GrammarViolation(f"token {token} committed where the grammar forbids it "
                                       f"(output token {i} of this step)")

    # -- state, for callers and tests -------------------------------------------------------------

    @property
    def is_complete(self) -> bool:
        """The output so far is a complete match and nothing more may follow but EOS."""
        return self._ended or self._matcher.is_stopped()

    def allowed_tokens(self) -> torch.Tensor:
        """``[V]`` bool: the tokens allowed after the committed output (for tests and diagnostics)."""
        self._back_to_committed()
        if self._ended:
            return torch.zeros(self._vocab_size, dtype=torch.bool)
        self._fill_mask(0)
        return torch.from_numpy(~self._forbidden(1)[0])


def _mask_rows(logits: torch.Tensor, rows: list[int], forbidden: np.ndarray) -> None:
    """``logits[rows[i]]`` := -inf where ``forbidden[i]`` (in place)."""
    if logits.device.type == "cpu" and logits.dtype == torch.float32:
        view = logits.detach().numpy()  # shares memory: numpy works in this thread, no intra-op pool
        for i, row in enumerate(rows):
            np.putmask(view[row], forbidden[i], -np.inf)
        return
    index = torch.tensor(rows, device=logits.device)
    mask = torch.from_numpy(forbidden).to(logits.device, non_blocking=True)
    logits[index] = logits[index].masked_fill(mask, float("-inf"))
