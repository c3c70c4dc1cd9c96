"""One sequence's pages in one model's layout: its block table, slots and rollback."""
from __future__ import annotations

import torch

from hyspec.errors import KVOwnershipError
from hyspec.kv.pool import KVLayout, KVPool


class SequenceKV:
    """Pages and length of one sequence's KV entries for one model (target or drafter)."""

    __slots__ = ("pool", "layout", "pages", "num_tokens", "__weakref__")

    def __init__(self, pool: KVPool, layout: KVLayout):
        self.pool = pool
        self.layout = layout
        self.pages: list[int] = []
        self.num_tokens = 0  # entries written and kept
        pool.holders.add(self)

    @property
    def capacity(self) -> int:
        return len(self.pages) * self.layout.block_size

    def pages_needed(self, total_tokens: int) -> int:
        return max(0, -(-total_tokens // self.layout.block_size) - len(self.pages))

    def reserve(self, total_tokens: int, reclaim: bool = True) -> None:
        """Make room for ``total_tokens`` entries (allocating pages; raises OutOfKVBlocks)."""
        need = self.pages_needed(total_tokens)
        if need:
            self.pages.extend(self.pool.allocate(self.layout.owner, need, reclaim=reclaim))

    def slots(self, start: int, count: int) -> list[int]:
        """Cache slots of entries ``start .. start+count-1`` (pages must be reserved)."""
        bs, pages = self.layout.block_size, self.pages
        return [pages[i // bs] * bs + i % bs for i in range(start, start + count)]

    def slot_tensor(self, start: int, count: int, device: torch.device) -> torch.Tensor:
        return torch.tensor(self.slots(start, count), dtype=torch.int64, device=device)

    def check_writable(self, start: int, count: int) -> None:
        """Ownership check on the pages entries ``start .. start+count-1`` live in."""
        bs = self.layout.block_size
        first, last = start // bs, (start + count - 1) // bs
        if last >= len(self.pages):
            raise KVOwnershipError(f"{self.layout.name}: write past the reserved pages")
        self.pool.check_owner(self.layout.owner, self.pages[first:last + 1], exclusive=True)

    def adopt(self, pages: list[int], num_tokens: int) -> None:
        """Start from ``pages`` that already hold entries ``0 .. num_tokens-1`` (a prefix cache's full pages):
        one more holder for each, read-only like every shared page.  Only an empty sequence adopts."""
        if self.pages or self.num_tokens:
            raise ValueError("adopt: the sequence already holds KV")
        if num_tokens > len(pages) * self.layout.block_size:
            raise ValueError(f"adopt: {num_tokens} entries do not fit {len(pages)} pages")
        self.pool.share(self.layout.owner, pages)
        self.pages = list(pages)
        self.num_tokens = num_tokens

    def fork(self) -> "SequenceKV":
        """A second sequence continuing from these entries: it shares the full pages (read-only for
        both) and gets a copy of the partly filled last page, so each writes its own continuation.
        Raises OutOfKVBlocks (holding nothing) when no page is free for that copy."""
        child = SequenceKV(self.pool, self.layout)
        bs = self.layout.block_size
        full, partial = divmod(self.num_tokens, bs)
        shared = self.pages[:full]
        copy = []
        if partial:
            copy = self.pool.allocate(self.layout.owner, 1, reclaim=False)
            self.pool.copy_page(self.pages[full], copy[0])
        self.pool.share(self.layout.owner, shared)
        child.pages = shared + copy
        child.num_tokens = self.num_tokens
        return child

    def truncate(self, num_tokens: int) -> None:
        """Keep the first ``num_tokens`` entries (roll back rejected ones) and free pages past them."""
        if num_tokens > self.num_tokens:
            raise ValueError(f"cannot truncate to {num_tokens}: only {self.num_tokens} entries exist")
        self.num_tokens = num_tokens
        keep = -(-num_tokens // self.layout.block_size)
        if keep < len(self.pages):
            self.pool.free(self.layout.owner, self.pages[keep:])
            del self.pages[keep:]

    def trim(self) -> int:
        """Free reserved pages past the kept entries (the next reserve takes what a step needs); returns
        how many.  Entries past ``num_tokens`` are dead by this class's contract, so nothing is lost."""
        keep = -(-self.num_tokens // self.layout.block_size)
        extra = self.pages[keep:]
        if extra:
            self.pool.free(self.layout.owner, extra)
            del self.pages[keep:]
        return len(extra)

    def release(self) -> None:
        self.pool.free(self.layout.owner, self.pages)
        self.pages = []
        self.num_tokens = 0
