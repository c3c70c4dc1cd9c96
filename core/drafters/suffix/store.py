"""Token sequences with an index of where each pattern ends: what suffix decoding matches against.

A :class:`TokenStore` holds sequences by serial number (a request's prompt and output as it grows,
or finished requests' responses) and indexes every position by the token that ends there and by
the ``QGRAM`` tokens that end there.  Each key keeps only its ``max_per_key`` newest occurrences:
frequencies are estimated over recent history, and a very common token costs bounded work.

Removal is first in, first out (:meth:`evict_oldest`): the oldest sequence's index entries are
the oldest under every key they share, so they sit at the front of each key's deque and are
popped in time proportional to the sequence's length.  Memory is therefore bounded by what the
owner keeps: one entry per indexed position and key, at most ``2 * tokens`` entries.
"""
from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass

#: the long key: the last QGRAM tokens (a match of at least QGRAM tokens is found from it at once)
QGRAM = 4
#: bytes per stored token and per index entry, for the memory figure (CPython: list slot + int,
#: tuple of two ints + deque slot; small ints are shared)
TOKEN_BYTES = 8
ENTRY_BYTES = 80


@dataclass(frozen=True)
class Match:
    """Where the context's longest suffix occurs: ``length`` tokens, ending at ``ends`` (serial, position).

    ``candidates`` holds every occurrence looked at with its own match length, newest last, so a
    caller can take the occurrences of a shorter suffix too (all those matching at least ``m``)."""

    length: int
    ends: list[tuple[int, int]]
    candidates: tuple[tuple[int, int, int], ...] = ()  # (serial, position, match length)

    def ends_at_least(self, m: int) -> list[tuple[int, int]]:
        return [(s, p) for s, p, n in self.candidates if n >= m]


class TokenStore:
    def __init__(self, max_per_key: int = 64):
        if max_per_key < 1:
            raise ValueError(f"max_per_key must be >= 1, got {max_per_key}")
        self.max_per_key = max_per_key
        self.sequences: OrderedDict[int, list[int]] = OrderedDict()  # serial -> tokens, oldest first
        self._index: dict[tuple[int, ...], deque[tuple[int, int]]] = {}
        self._keys: dict[int, list[tuple[int, ...]]] = {}  # serial -> keys it added entries to, in order
        self.num_tokens = 0
        self.num_entries = 0

    def __len__(self) -> int:
        return len(self.sequences)

    def memory_bytes(self) -> int:
        """An estimate of what the store holds: its tokens and index entries."""
        return self.num_tokens * TOKEN_BYTES + self.num_entries * ENTRY_BYTES

    def extend(self, serial: int, tokens: list[int]) -> None:
        """Append ``tokens`` to sequence ``serial`` (created if new) and index the new positions."""
        seq = self.sequences.get(serial)
        if seq is None:
            seq = self.sequences[serial] = []
            self._keys[serial] = []
        start = len(seq)
        seq.extend(tokens)
        self.num_tokens += len(tokens)
        keys = self._keys[serial]
        for pos in range(start, len(seq)):
            for key in ((seq[pos],), tuple(seq[pos - QGRAM + 1:pos + 1]) if pos >= QGRAM - 1 else None):
                if key is None:
                    continue
                entries = self._index.get(key)
                if entries is None:
                    entries = self._index[key] = deque()
                if len(entries) == self.max_per_key:  # the oldest occurrence makes room
                    entries.popleft()
                    self.num_entries -= 1
                entries.append((serial, pos))
                self.num_entries += 1
                keys.append(key)

    def evict_oldest(self) -> int | None:
        """Drop the oldest sequence and its index entries; returns its serial (None when empty)."""
        if not self.sequences:
            return None
        serial, seq = self.sequences.popitem(last=False)
        self.num_tokens -= len(seq)
        for key in self._keys.pop(serial):
            entries = self._index.get(key)
            # the oldest sequence's entries lead every deque (or were already pushed out by newer ones)
            while entries and entries[0][0] == serial:
                entries.popleft()
                self.num_entries -= 1
            if entries is not None and not entries:
                del self._index[key]
        return serial

    def longest_match(self, context: list[int], max_length: int, exclude_end: tuple[int, int] | None = None) -> Match:
        """The occurrences of the longest suffix of ``context`` (at most ``max_length`` tokens) that are
        followed by at least one more token; ``exclude_end`` is an occurrence not to count (the
        context's own end, when the context is itself stored here)."""
        if not context or max_length < 1:
            return Match(0, [])
        match = Match(0, [])
        if len(context) >= QGRAM and max_length >= QGRAM:  # a match of QGRAM tokens or more, if any
            match = self._best(self._index.get(tuple(context[-QGRAM:]), ()), context, max_length, exclude_end)
        if match.length == 0:  # else any match, from the last token alone
            match = self._best(self._index.get((context[-1],), ()), context, max_length, exclude_end)
        return match

    def _best(self, candidates, context: list[int], max_length: int, exclude_end: tuple[int, int] | None) -> Match:
        best, ends, seen = 0, [], []
        for serial, pos in candidates:
            if (serial, pos) == exclude_end:
                continue
            seq = self.sequences[serial]
            if pos + 1 >= len(seq):
                continue  # nothing follows it (yet)
            length = 0
            while length < max_length and pos - length >= 0 and length < len(context) \
                    and seq[pos - length] == context[-1 - length]:
                length += 1
            if length > 0:
                seen.append((serial, pos, length))
            if length > best:
                best, ends = length, [(serial, pos)]
            elif length == best and length > 0:
                ends.append((serial, pos))
        return Match(best, ends, tuple(seen))

    def continuations(self, ends: list[tuple[int, int]], depth: int) -> list[list[int]]:
        """Up to ``depth`` tokens that followed each occurrence (within its own sequence)."""
        return [self.sequences[s][p + 1:p + 1 + depth] for s, p in ends]
