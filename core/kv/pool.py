"""One paged KV pool shared by the target and its drafters.

Memory is a single byte buffer cut into equal *pages*.  Each model that keeps
a KV cache registers a :class:`KVLayout`: it views every page as
``[layers, 2, block_size, kv_heads, head_dim]`` of its own dtype, choosing its
``block_size`` (tokens per page) so that the page fits.  A page therefore
serves whichever model owns it, and the split between target and drafters is
dynamic: pages go where they are needed (the target first -- draft caches are
reclaimable because drafters can recompute them lazily).

Every page has an owner; writers call :meth:`KVPool.check_owner` on the pages
they are about to write, so a bookkeeping bug surfaces as
:class:`~hyspec.errors.KVOwnershipError` (counted as ``kv_cache_mismatch``)
instead of silently corrupting another model's cache.

A page may also be *shared* by several sequences of its owner (the samples of
an ``n > 1`` request share their prompt's full pages): it carries a reference
count, :meth:`KVPool.free` only returns it to the free list when the last
holder lets go, and a shared page is read-only (:meth:`KVPool.check_owner`
with ``exclusive=True`` refuses a write into it).
"""
from __future__ import annotations

import logging
import weakref
from collections import deque
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from hyspec.errors import HyspecError, KVOwnershipError

log = logging.getLogger(__name__)

FREE = 0


class OutOfKVBlocks(HyspecError):
    """The pool has no free page for a request that needs one."""


@dataclass(frozen=True)
class KVLayout:
    """How one model sees the pool's pages."""

    owner: int  # owner id stamped on this model's pages
    name: str
    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: torch.dtype
    block_size: int  # tokens per page for this model
    caches: tuple[tuple[torch.Tensor, torch.Tensor], ...]  # per layer (k, v): [num_pages, block_size, Hkv, D] views

    def slot(self, page: int, offset: int) -> int:
        return page * self.block_size + offset


class KVPool:
    def __init__(self, num_pages: int, page_bytes: int, device: torch.device | str = "cpu"):
        if num_pages < 1:
            raise HyspecError(f"the KV pool needs at least one page; the memory budget gives {num_pages}")
        self.num_pages = num_pages
        self.page_bytes = page_bytes
        #: (multiple, largest) for default block sizes, from the backend (Backend.block_size_rule); None: any fit
        self.block_size_rule: tuple[int, int | None] | None = None
        self.device = torch.device(device)
        # Zeroed, not empty: attention multiplies masked-out entries by 0, and 0 * NaN garbage is NaN.
        self.buffer = torch.zeros(num_pages * page_bytes, dtype=torch.uint8, device=self.device)
        self.owner = np.zeros(num_pages, dtype=np.int32)
        self.refs = np.zeros(num_pages, dtype=np.int32)  # holders of each page (0 = free)
        self._free: deque[int] = deque(range(num_pages))
        self._layouts: dict[int, KVLayout] = {}
        self._reclaimers: list[Callable[[int], int]] = []
        # evictors free pages no live sequence holds (the prefix cache's): tried before any failure, for
        # every allocation, since dropping them costs nobody anything but a future prefill
        self._evictors: list[Callable[[int], int]] = []
        self.holders: "weakref.WeakSet" = weakref.WeakSet()  # live SequenceKVs (fragmentation.py reads them)

    def release(self) -> None:
        """Free the pages' memory now (the engine is closing), though per-layer views of it are still held.

        Every layer's K/V tensor is a view of ``buffer``; shrinking the shared storage to nothing frees the
        memory whoever holds a view, so the next engine in this process finds it free.  Reading KV afterwards
        is an error, as generating after ``LLM.close()`` is.
        """
        self.buffer.untyped_storage().resize_(0)

    @classmethod
    def for_budget(cls, budget_bytes: int, page_bytes: int, device: torch.device | str = "cpu") -> "KVPool":
        return cls(max(budget_bytes // page_bytes, 0), page_bytes, device)

    # -- layouts ---------------------------------------------------------------------------------

    def register(self, name: str, num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype,
                 block_size: int | None = None) -> KVLayout:
        """Add a model's view of the pages; ``block_size`` defaults to as many tokens as fit.

        Within ``block_size_rule`` (multiple, largest) when the backend set one: the NPU's paged kernels take
        multiples of 128 up to 512, so a one-layer drafter gets 512-token blocks, not all of a 30-layer page.
        """
        elem = torch.empty((), dtype=dtype).element_size()
        per_token = num_layers * 2 * num_kv_heads * head_dim * elem
        fit = self.page_bytes // per_token
        if block_size is None:
            multiple, largest = self.block_size_rule or (16, None)  # multiples of 16 suit every kernel
            block_size = fit if largest is None else min(fit, largest)
            block_size = block_size if block_size < multiple else block_size - block_size % multiple
        if block_size < 1 or block_size > fit:
            raise HyspecError(f"KV layout {name!r}: block_size {block_size} does not fit a {self.page_bytes}-byte page "
                              f"({per_token} bytes per token)")
        if self.page_bytes % elem:
            raise HyspecError(f"KV page size {self.page_bytes} is not a multiple of {dtype}'s element size")
        for layout in self._layouts.values():  # a drafter reloaded after a release gets its old view back
            if (layout.name, layout.num_layers, layout.num_kv_heads, layout.head_dim, layout.dtype,
                    layout.block_size) == (name, num_layers, num_kv_heads, head_dim, dtype, block_size):
                return layout
        owner = len(self._layouts) + 1
        typed = self.buffer.view(dtype)
        page_elems = self.page_bytes // elem
        token_elems = num_kv_heads * head_dim
        layer_elems = 2 * block_size * token_elems
        caches = []
        for layer in range(num_layers):
            def view(which: int) -> torch.Tensor:
                return typed.as_strided(
                    (self.num_pages, block_size, num_kv_heads, head_dim),
                    (page_elems, token_elems, head_dim, 1),
                    layer * layer_elems + which * block_size * token_elems)
            caches.append((view(0), view(1)))
        layout = KVLayout(owner, name, num_layers, num_kv_heads, head_dim, dtype, block_size, tuple(caches))
        self._layouts[owner] = layout
        return layout

    @staticmethod
    def page_bytes_for(num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype, block_size: int) -> int:
        elem = torch.empty((), dtype=dtype).element_size()
        return num_layers * 2 * block_size * num_kv_heads * head_dim * elem

    def add_reclaimer(self, reclaim: Callable[[int], int]) -> None:
        """``reclaim(pages_wanted) -> pages_freed``: called when a target allocation finds the pool full."""
        self._reclaimers.append(reclaim)

    def add_evictor(self, evict: Callable[[int], int]) -> None:
        """``evict(pages_wanted) -> pages_freed`` over pages only a cache holds: called whenever free pages run
        short, before reclaimers (which cost a drafter its cache) and whether or not the caller allows those."""
        self._evictors.append(evict)

    def remove_reclaimers_of(self, owner_object: object) -> None:
        """Forget the reclaimers bound to ``owner_object`` (a released drafter must not be kept alive)."""
        self._reclaimers = [r for r in self._reclaimers if getattr(r, "__self__", None) is not owner_object]

    # -- allocation ------------------------------------------------------------------------------

    @property
    def num_free(self) -> int:
        return len(self._free)

    def usage(self) -> float:
        return 1.0 - len(self._free) / self.num_pages

    def pages_by_owner(self) -> dict[str, int]:
        counts = np.bincount(self.owner, minlength=len(self._layouts) + 1)
        out = {"free": int(counts[FREE])}
        for owner, layout in self._layouts.items():
            out[layout.name] = int(counts[owner])
        return out

    def allocate(self, owner: int, count: int, reclaim: bool = True) -> list[int]:
        if count <= 0:
            return []
        for evictor in self._evictors:
            if len(self._free) >= count:
                break
            evictor(count - len(self._free))
        if len(self._free) < count and reclaim:
            for reclaimer in self._reclaimers:
                reclaimer(count - len(self._free))
                if len(self._free) >= count:
                    break
        if len(self._free) < count:
            raise OutOfKVBlocks(f"KV pool exhausted: {count} pages wanted, {len(self._free)} free of {self.num_pages}")
        pages = [self._free.popleft() for _ in range(count)]
        self.owner[pages] = owner
        self.refs[pages] = 1
        return pages

    def free(self, owner: int, pages: list[int]) -> None:
        """Let go of ``pages``; each returns to the free list when its last holder let go."""
        if not pages:
            return
        idx = np.asarray(pages)
        wrong = idx[self.owner[idx] != owner]
        if wrong.size:
            raise KVOwnershipError(f"free of pages {wrong[:4].tolist()} not owned by {self._name(owner)}")
        self.refs[idx] -= 1
        released = [p for p in pages if self.refs[p] == 0]
        self.owner[released] = FREE
        self._free.extend(released)

    def share(self, owner: int, pages: list[int]) -> None:
        """One more holder for each of ``pages`` (``owner``'s): they stay until every holder freed them."""
        if not pages:
            return
        self.check_owner(owner, pages)
        self.refs[np.asarray(pages)] += 1

    def copy_page(self, src: int, dst: int) -> None:
        """Copy page ``src``'s bytes (every layer's K and V) into page ``dst``."""
        pb = self.page_bytes
        self.buffer[dst * pb:(dst + 1) * pb].copy_(self.buffer[src * pb:(src + 1) * pb])

    @property
    def num_shared(self) -> int:
        """Pages held by more than one sequence."""
        return int((self.refs > 1).sum())

    def check_owner(self, owner: int, pages, exclusive: bool = False) -> None:
        """Raise :class:`KVOwnershipError` unless every page in ``pages`` belongs to ``owner``
        (and, with ``exclusive``, is held by one sequence only: shared pages are read-only)."""
        if len(pages) == 1:  # a decoding step writes one page: the same checks on it without building arrays
            page = int(pages[0])
            if not 0 <= page < self.num_pages:
                raise KVOwnershipError(f"{self._name(owner)} addressed a page outside the pool")
            if self.owner[page] != owner:
                raise KVOwnershipError(f"{self._name(owner)} would write page {page} owned by "
                                       f"{self._name(int(self.owner[page]))}")
            if exclusive and self.refs[page] > 1:
                raise KVOwnershipError(f"{self._name(owner)} would write page {page}, which "
                                       f"{int(self.refs[page])} sequences share")
            return
        idx = np.asarray(pages, dtype=np.int64)
        if idx.size and (idx.min() < 0 or idx.max() >= self.num_pages):
            raise KVOwnershipError(f"{self._name(owner)} addressed a page outside the pool")
        bad = idx[self.owner[idx] != owner]
        if bad.size:
            holder = self._name(int(self.owner[bad[0]]))
            raise KVOwnershipError(f"{self._name(owner)} would write page {int(bad[0])} owned by {holder}")
        if exclusive:
            shared = idx[self.refs[idx] > 1]
            if shared.size:
                raise KVOwnershipError(f"{self._name(owner)} would write page {int(shared[0])}, which "
                                       f"{int(self.refs[shared[0]])} sequences share")

    def _name(self, owner: int) -> str:
        if owner == FREE:
            return "nobody (free)"
        layout = self._layouts.get(owner)
        return layout.name if layout else f"owner {owner}"

    def check_invariants(self) -> None:
        """Every page is either free (exactly once in the free list) or owned; nothing leaked or doubled."""
        free = list(self._free)
        if len(set(free)) != len(free):
            raise AssertionError("a page is in the free list twice")
        owned_free = [p for p in free if self.owner[p] != FREE]
        if owned_free:
            raise AssertionError(f"pages {owned_free[:4]} are both free and owned")
        if int((self.owner == FREE).sum()) != len(free):
            raise AssertionError("a page is unowned but not in the free list (leaked)")
        if bool((self.refs[self.owner == FREE] != 0).any()) or bool((self.refs[self.owner != FREE] < 1).any()):
            raise AssertionError("a page's holder count disagrees with its owner (free pages have none)")

    def assert_all_free(self) -> None:
        """After every request finished: invariants hold and no layout (target or drafter) holds a page."""
        self.check_invariants()
        if self.num_free != self.num_pages:
            held = {k: v for k, v in self.pages_by_owner().items() if k != "free" and v}
            raise AssertionError(f"{self.num_pages - self.num_free} of {self.num_pages} KV pages still held: {held}")
