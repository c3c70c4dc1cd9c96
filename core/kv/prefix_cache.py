"""Automatic prefix caching (vLLM's ``enable_prefix_caching``): full KV pages of earlier prompts, reused.

Agents resend the same context: a request that repeats an earlier prompt, or shares its opening
(the chat template's system turn, the same file embedded again), would otherwise prefill those
tokens again.  Once a prompt's prefill is done, each of its *full* pages is entered here under its
content: the tokens of the page and the page that precedes it in the chain, so a page is found only
after the very same tokens from position 0.  A new request then adopts the longest chain of pages
its own prompt starts with and prefills only the rest.

Exactness.  Keys are compared by equality (the parent page and the page's own tokens), not by a
hash alone, so two different prefixes can never meet.  A cached page holds exactly what a prefill
of those tokens wrote; the remaining tokens are prefilled against it the way a later chunk of a
chunked prefill is, so outputs equal those of an engine without the cache wherever chunked prefill
equals one-shot prefill (tests/test_prefix_cache.py checks greedy tokens both ways).

Lifetime.  The cache holds one reference to each page it lists (:meth:`KVPool.share`), so a page
outlives the request that wrote it; a sequence that adopts it holds another, and shared pages are
read-only.  Pages nobody but the cache holds are evicted, least recently used first and only
leaves of the chain (a parent stays while a cached child names it, so a freed and reused page can
never be found as some other chain's parent), whenever the pool runs short of free pages.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from hyspec.kv.pool import KVLayout, KVPool

_ROOT = -1  # the parent of a prompt's first page

Key = tuple[int, tuple[int, ...]]  # (parent page or _ROOT, the page's tokens)


@dataclass
class PrefixCacheStats:
    """Counted in tokens, as vLLM's ``prefix_cache_queries`` / ``prefix_cache_hits`` are."""

    queries: int = 0  # prompt tokens looked up
    hits: int = 0  # of those, found cached (their prefill was skipped)
    evicted_pages: int = 0


class PrefixCache:
    def __init__(self, pool: KVPool, layout: KVLayout):
        self.pool = pool
        self.layout = layout
        self.block_size = layout.block_size
        self._pages: dict[Key, int] = {}
        self._key_of: dict[int, Key] = {}
        self._children: dict[int, int] = {}  # page -> cached pages whose parent it is
        self._lru: OrderedDict[int, None] = OrderedDict()  # least recently used first
        self.stats = PrefixCacheStats()
        pool.add_evictor(self.evict)

    def __len__(self) -> int:
        return len(self._key_of)

    def _block(self, tokens: list[int], i: int) -> tuple[int, ...]:
        return tuple(tokens[i * self.block_size:(i + 1) * self.block_size])

    def match(self, tokens: list[int], limit: int) -> list[int]:
        """Pages holding the longest run of full pages ``tokens[:limit]`` starts with (the caller then adopts
        them: :meth:`SequenceKV.adopt`).  Counted as a query of ``limit`` tokens."""
        pages: list[int] = []
        parent = _ROOT
        for i in range(max(limit, 0) // self.block_size):
            page = self._pages.get((parent, self._block(tokens, i)))
            if page is None:
                break
            pages.append(page)
            parent = page
        for page in pages:
            self._lru.move_to_end(page)
        self.stats.queries += max(limit, 0)
        self.stats.hits += len(pages) * self.block_size
        return pages

    def insert(self, tokens: list[int], pages: list[int]) -> int:
        """Enter the full pages of ``tokens`` (whose KV ``pages`` hold, in order); returns pages newly cached.
        A page whose content is cached already (another request's copy) is skipped, the chain goes on
        from the cached one."""
        added = 0
        parent = _ROOT
        for i in range(min(len(tokens) // self.block_size, len(pages))):
            key = (parent, self._block(tokens, i))
            cached = self._pages.get(key)
            if cached is not None:
                self._lru.move_to_end(cached)
                parent = cached
                continue
            page = pages[i]
            if page in self._key_of:  # the page is cached under another chain: cannot happen, but never alias
                break
            self.pool.share(self.layout.owner, [page])
            self._pages[key] = page
            self._key_of[page] = key
            self._lru[page] = None
            if parent != _ROOT:
                self._children[parent] = self._children.get(parent, 0) + 1
            parent = page
            added += 1
        return added

    def evict(self, wanted: int) -> int:
        """Free up to ``wanted`` pages that only the cache holds (leaves, least recently used first)."""
        freed = 0
        progress = True
        while freed < wanted and progress:
            progress = False
            for page in list(self._lru):
                if freed >= wanted:
                    break
                if self._children.get(page, 0) == 0 and int(self.pool.refs[page]) == 1:
                    self._drop(page)
                    freed += 1
                    progress = True
        self.stats.evicted_pages += freed
        return freed

    def reset(self) -> None:
        """Forget every entry (vLLM's ``reset_prefix_cache``); pages live sequences hold stay theirs."""
        pages = list(self._key_of)
        self._pages.clear()
        self._key_of.clear()
        self._children.clear()
        self._lru.clear()
        self.pool.free(self.layout.owner, pages)

    def _drop(self, page: int) -> None:
        key = self._key_of.pop(page)
        del self._pages[key]
        del self._lru[page]
        self._children.pop(page, None)
        parent = key[0]
        if parent != _ROOT:
            self._children[parent] -= 1
        self.pool.free(self.layout.owner, [page])

