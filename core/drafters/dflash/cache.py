"""Per-sequence draft state of the hidden-state drafters (MTP, DFlash, DSpark).

These drafters keep KV of their own in the shared pool, built from the
target's hidden states that :meth:`Proposer.on_commit` hands over after every
step.  The rows are buffered (:class:`HiddenBuffer`) and absorbed into the
draft KV at the next ``propose`` (lazy catch-up: the dispatcher may leave a
method idle for many steps).

Unlike ``draft_model``, a hidden-state drafter cannot recompute a dropped
cache from token ids.  When the pool reclaims its pages (the target needs
them) or a hidden-state row goes missing, the sequence's draft state restarts
at the next committed position: KV index 0 then holds position ``offset``
rather than 0, RoPE positions are ``offset + index``, and the drafter sees a
context window that starts there.  Drafts get worse, never wrong: every draft
is verified.
"""
from __future__ import annotations

import dataclasses
from collections import OrderedDict
from typing import Callable, Generic, TypeVar

import torch

from hyspec.seam.forward import BatchInputs, Feed, build_inputs


class HiddenBuffer:
    """Hidden-state rows of consecutive positions ``[start, end)`` not yet absorbed into a draft cache."""

    __slots__ = ("start", "_chunks", "_count")

    def __init__(self, start: int):
        self.start = start
        self._chunks: list[torch.Tensor] = []
        self._count = 0

    def __len__(self) -> int:
        return self._count

    @property
    def end(self) -> int:
        return self.start + self._count

    def append(self, rows: torch.Tensor) -> None:  # rows [n, F]
        if rows.shape[0]:
            self._chunks.append(rows)
            self._count += rows.shape[0]

    def rows(self) -> torch.Tensor:  # [len, F]
        if len(self._chunks) > 1:
            self._chunks = [torch.cat(self._chunks)]
        return self._chunks[0]

    def drop(self, count: int) -> None:
        """Forget the first ``count`` rows (absorbed for good)."""
        if count <= 0:
            return
        if count > self._count:
            raise ValueError(f"cannot drop {count} of {self._count} buffered rows")
        rest = self.rows()[count:] if count < self._count else None
        self._chunks = [rest] if rest is not None and rest.shape[0] else []
        self._count -= count
        self.start += count


S = TypeVar("S")


class DraftStates(Generic[S]):
    """Request id -> draft state, least recently drafted first (the order reclaiming follows)."""

    def __init__(self, release: Callable[[S], int]):
        self._states: OrderedDict[str, S] = OrderedDict()
        self._release = release  # frees a state's pages, returns how many

    def get(self, request_id: str) -> S | None:
        return self._states.get(request_id)

    def put(self, request_id: str, state: S) -> None:
        old = self._states.pop(request_id, None)
        if old is not None:
            self._release(old)
        self._states[request_id] = state

    def touch(self, request_id: str) -> None:
        self._states.move_to_end(request_id)

    def drop(self, request_id: str) -> None:
        state = self._states.pop(request_id, None)
        if state is not None:
            self._release(state)

    def reclaim(self, pages_wanted: int) -> int:
        """Pool reclaimer: drop the least recently drafted states until enough pages are free."""
        freed = 0
        for rid in list(self._states):
            if freed >= pages_wanted:
                break
            freed += self._release(self._states.pop(rid))
        return freed

    def __len__(self) -> int:
        return len(self._states)

    def values(self) -> list[S]:
        return list(self._states.values())


def shifted_inputs(feeds: list[Feed], offsets: list[int], device: torch.device) -> BatchInputs:
    """``build_inputs`` with every feed's RoPE positions moved by its state's ``offset``.

    KV index ``i`` of a restarted state holds position ``offset + i``.
    """
    inputs = build_inputs(feeds, device)
    if not any(offsets):
        return inputs
    shift = torch.cat([torch.full((n,), off, dtype=torch.int64)
                       for off, (_, n) in zip(offsets, inputs.token_rows)]).to(device)
    positions = inputs.positions + shift
    return dataclasses.replace(inputs, positions=positions, meta=dataclasses.replace(inputs.meta, positions=positions))
