"""Continuous batching: which sequences run this step, with how many tokens.

Each step, running sequences decode first (one token each, plus the KV room
their drafts need); the remaining token budget goes to prompt chunks of
waiting sequences (chunked prefill), so prefill and decode share a forward.
When the KV pool runs dry the newest running sequence is preempted: its pages
are freed and it is re-prefilled later from prompt + output so far (the
output it already produced is kept, so nothing is lost or repeated).

In-batch prefix sharing (with prefix caching).  A prompt's full pages enter the
prefix cache when its prefill ends, so requests that arrive together and share
an opening (the chat template's system turn, the same document, a prompt sent
n times) would each prefill it in the same step.  A waiting request that opens
with a page a running prefill is writing is passed over until that prefill
ends; it then adopts those pages from the cache and prefills only the rest (SGLang's in-batch prefix caching does the same: sgl-project/sglang
python/sglang/srt/managers/schedule_policy.py at ad0119f).  Requests behind it
are admitted meanwhile; at most ``MAX_PASSED_OVER`` are passed over per step.
"""
from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

from hyspec.engine.sequence import Sequence, Status
from hyspec.errors import ConfigError
from hyspec.kv.pool import OutOfKVBlocks

log = logging.getLogger(__name__)

#: waiting requests passed over in one step because a prefill now running writes their opening pages
MAX_PASSED_OVER = 64


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 1024
    max_model_len: int = 2048

    def __post_init__(self) -> None:
        for key in ("max_num_seqs", "max_num_batched_tokens", "max_model_len"):
            if getattr(self, key) < 1:
                raise ConfigError(key, f"must be at least 1, got {getattr(self, key)}")


@dataclass
class SchedulerOutput:
    decodes: list[Sequence] = field(default_factory=list)  # feed their last token (+ drafts)
    prefills: list[tuple[Sequence, int]] = field(default_factory=list)  # (seq, tokens this chunk)
    preempted: list[Sequence] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not self.decodes and not self.prefills


class Scheduler:
    def __init__(self, config: SchedulerConfig):
        self.config = config
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        # memory pressure as the last schedule met it (read by the speculation strategy's plan)
        self.admission_blocked = False  # requests waited that the KV pool could not admit
        self.preempted_last = 0  # sequences preempted by the last schedule
        #: called for a sequence about to be admitted with no KV: may adopt cached prefix pages (the engine's
        #: prefix cache), so only the rest of its prompt is scheduled for prefill
        self.prefix_lookup: Callable[[Sequence], None] | None = None
        #: KV tokens per page, set with ``prefix_lookup``: turns on in-batch prefix sharing (module docstring)
        self.prefix_block_size: int | None = None
        self.passed_over = 0  # admissions put off for a running prefill's pages (in-batch prefix sharing)
        self._writes: dict[str, list[int]] = {}  # request id -> keys of the pages its running prefill writes

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    @property
    def num_unfinished(self) -> int:
        return len(self.waiting) + len(self.running)

    def schedule(self, lookahead: int = 0) -> SchedulerOutput:
        """Plan one step; ``lookahead`` extra KV entries per decode hold draft tokens."""
        out = SchedulerOutput()
        budget = self.config.max_num_batched_tokens
        # Decodes (and re-prefills of preempted sequences that were running) first.
        i = 0
        while i < len(self.running):
            seq = self.running[i]
            if seq.in_prefill:  # a prompt chunked over several steps
                i += 1
                continue
            need = len(seq.token_ids) + lookahead
            if not self._reserve(seq, need, out):
                continue  # seq (or a newer one) was preempted; re-examine index i
            out.decodes.append(seq)
            budget -= 1 + lookahead
            i += 1
        for seq in list(self.running):
            if seq.in_prefill and budget > 0 and seq not in out.preempted:
                chunk = min(len(seq.token_ids) - seq.num_cached, budget)
                if self._reserve(seq, seq.num_cached + chunk, out):
                    out.prefills.append((seq, chunk))
                    budget -= chunk
        # Admit waiting sequences while room remains.
        self.admission_blocked = False
        writing = self._pages_being_written()
        passed_over: list[Sequence] = []
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            seq = self.waiting.popleft()
            pages = self._prompt_pages(seq)
            if (writing and len(passed_over) < MAX_PASSED_OVER and not seq.wants_prompt_logprobs
                    and not seq.kv.pages and any(key in writing for key in pages)):
                passed_over.append(seq)  # a running prefill writes pages it opens with: it adopts them later
                continue
            if self.prefix_lookup is not None and not seq.kv.pages:
                self.prefix_lookup(seq)
            chunk = min(len(seq.token_ids) - seq.num_cached, budget)
            try:
                seq.kv.reserve(seq.num_cached + chunk, reclaim=True)
            except OutOfKVBlocks:
                seq.kv.release()  # adopted prefix pages go back to the cache alone (evictable) while it waits
                self.waiting.appendleft(seq)
                self.admission_blocked = True
                break
            seq.status = Status.RUNNING
            self.running.append(seq)
            out.prefills.append((seq, chunk))
            if pages:
                self._writes[seq.request_id] = pages[seq.num_cached // self.prefix_block_size:]
                writing.update(self._writes[seq.request_id])
            budget -= chunk
        self.waiting.extendleft(reversed(passed_over))  # first in line again, in their order
        self.passed_over += len(passed_over)
        self.preempted_last = len(out.preempted)
        return out

    def _prompt_pages(self, seq: Sequence) -> list[int]:
        """Chain keys of the full pages of what ``seq`` prefills (all but its last token) when in-batch prefix
        sharing is on: page i's key hashes the tokens of pages 0..i, so equal keys mean an equal opening (a
        collision only costs a needless wait)."""
        size = self.prefix_block_size
        if size is None:
            return []
        keys, key, tokens = [], 0, seq.token_ids
        for start in range(0, len(tokens) - size, size):
            key = hash((key, tuple(tokens[start:start + size])))
            keys.append(key)
        return keys

    def _pages_being_written(self) -> set[int]:
        """Keys of the pages running prefills write (the prefix cache has them only once a prefill ends)."""
        if not self._writes:
            return set()
        prefilling = {seq.request_id for seq in self.running if seq.in_prefill}
        for rid in [r for r in self._writes if r not in prefilling]:
            del self._writes[rid]
        return {key for keys in self._writes.values() for key in keys}

    def _reserve(self, seq: Sequence, total: int, out: SchedulerOutput, preempt: bool = True) -> bool:
        while True:
            try:
                seq.kv.reserve(total)
                return True
            except OutOfKVBlocks:
                if not preempt:
                    return False
                victim = self.running[-1]
                self._preempt(victim, out)
                if victim is seq:
                    return False

    def _preempt(self, seq: Sequence, out: SchedulerOutput) -> None:
        log.info("preempting %s: KV pool full (it will be re-prefilled)", seq.request_id)
        self.running.remove(seq)
        if seq in out.decodes:
            out.decodes.remove(seq)
        seq.kv.release()
        seq.status = Status.WAITING
        seq.num_preemptions += 1
        self.waiting.appendleft(seq)
        out.preempted.append(seq)

    def finish(self, seq: Sequence) -> None:
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        seq.kv.release()
        seq.status = Status.FINISHED
