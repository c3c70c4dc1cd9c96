"""Continuous batching: which sequences run this step, with how many tokens.

Each step, running sequences decode first (one token each, plus the KV room
their drafts need); the remaining token budget goes to prompt chunks of
waiting sequences (chunked prefill), so prefill and decode share a forward.
When the KV pool runs dry the newest running sequence is preempted: its pages
are freed and it is re-prefilled later from prompt + output so far (the
output it already produced is kept, so nothing is lost or repeated).
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
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            seq = self.waiting[0]
            if self.prefix_lookup is not None and not seq.kv.pages:
                self.prefix_lookup(seq)
            chunk = min(len(seq.token_ids) - seq.num_cached, budget)
            try:
                seq.kv.reserve(seq.num_cached + chunk, reclaim=True)
            except OutOfKVBlocks:
                seq.kv.release()  # adopted prefix pages go back to the cache alone (evictable) while it waits
                self.admission_blocked = True
                break
            self.waiting.popleft()
            seq.status = Status.RUNNING
            self.running.append(seq)
            out.prefills.append((seq, chunk))
            budget -= chunk
        self.preempted_last = len(out.preempted)
        return out

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
