"""The worker side of remote drafting: any hyspec Proposer, fed by messages instead of an engine.

A :class:`DraftHost` keeps a shadow of every sequence the target sent (its
committed token history, sampling parameters and a generator) and calls
the hosted proposer exactly as the engine would, so every drafter runs
remotely unchanged and keeps catching up lazily from the history.  All
drafting runs on one compute thread: that serialises the drafter's state
without locks, and it is the thread whose torch intra-op thread count the
adaptive scheduler sets (``torch.set_num_threads`` is per thread).

Pipelining.  After answering step t with draft d for a sequence whose
history is h, the host drafts step t+1 on the assumption that every draft
is accepted: it asks the drafter for b + 1 tokens after h + d.  The first
of them is the drafter's guess of the bonus token (the target samples it
after the last accepted draft, so it is unknown until verification); the
rest is the draft for h + d + [guess].  Only the single most likely bonus
is drafted for: covering m candidates costs m times the CPU, while the
hypothesis already needs all b drafts accepted, which dominates the odds.
At step t+1 the hypothesis is checked token by token against what the
target committed; a hit answers at once, a miss discards the work (the
drafter rolls its state back by longest common prefix, as it does for any
rejected draft).  Speculative work is skipped when a real call is already
waiting, so it never delays one by more than the draft it is running.
"""
from __future__ import annotations

import logging
import os
import threading
import time
import uuid
import zlib
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import torch

from hyspec.ops.sampling import SamplingTensors
from hyspec.remote.protocol import DraftCall, DraftReply, SamplingSpec, SeqDraft, SeqUpdate, decode_call, encode_reply
from hyspec.seam.proposer import CommittedHidden, DraftRequest, Proposer
from hyspec.seam.tree import DraftTree

log = logging.getLogger(__name__)

GARBAGE_KINDS = ("lengths", "ids", "nan", "stale", "bytes")


class ShadowSequence:
    """What a proposer reads from a Sequence, rebuilt from messages."""

    __slots__ = ("request_id", "token_ids", "params", "generator")

    def __init__(self, request_id: str, token_ids: list[int], params: SamplingSpec,
                 generator: torch.Generator | None):
        self.request_id = request_id
        self.token_ids = token_ids
        self.params = params
        self.generator = generator

    @property
    def last_token(self) -> int:
        return self.token_ids[-1]

    @property
    def num_cached(self) -> int:  # the target holds KV for every token but the last
        return len(self.token_ids) - 1

    @property
    def in_prefill(self) -> bool:
        return False


@dataclass
class Fault:
    """Injected misbehaviour (tests and chaos drills): a slow CPU or a corrupt drafter."""

    delay_ms: float = 0.0
    garbage: str | None = None

    def __post_init__(self) -> None:
        if self.delay_ms < 0:
            raise ValueError(f"delay_ms must be >= 0, got {self.delay_ms}")
        if self.garbage is not None and self.garbage not in GARBAGE_KINDS:
            raise ValueError(f"garbage must be one of {GARBAGE_KINDS}, got {self.garbage!r}")


@dataclass
class _Speculation:
    base_len: int  # history length when it was drafted
    expect: list[int]  # the tokens the target must commit next: all drafts + the guessed bonus
    draft: list[int]  # the draft for the history base + expect
    q: torch.Tensor | None  # [len(draft), V]


class DraftHost:
    def __init__(self, proposer: Proposer, vocab_size: int, fingerprint: str | None = None,
                 max_sequences: int = 4096):
        self.proposer = proposer
        self.vocab_size = vocab_size  # the target's: drafts and q rows are over it
        self.fingerprint = fingerprint  # of the drafter's tokenizer; the target checks it against its own
        self.max_sequences = max_sequences
        self.incarnation = uuid.uuid4().hex  # a restarted worker has a new one: the target resends histories
        self.cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        self.threads = self.cores
        self.fault = Fault()
        self._shadows: OrderedDict[str, ShadowSequence] = OrderedDict()
        self._spec: dict[str, _Speculation] = {}
        self._compute = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hyspec-draft")
        self._lock = threading.Lock()  # guards the counters below (read by ping from other threads)
        self._waiting_real = 0
        self._applied_threads = 0
        self.calls = self.spec_hits = self.spec_misses = self.spec_skipped = self.gaps = 0
        self._cpu_mark = (time.monotonic(), time.process_time())

    # -- entry points (any thread) -----------------------------------------------------------------

    def handle(self, payload: bytes) -> bytes:
        """Answer one encoded DraftCall with an encoded DraftReply."""
        call = decode_call(payload)
        if call.threads is not None:
            self.threads = max(1, min(int(call.threads), self.cores))
        with self._lock:
            self._waiting_real += 1
            self.calls += 1
        reply = self._compute.submit(self._run_call, call).result()
        if self.fault.garbage == "bytes":
            return os.urandom(96)
        return encode_reply(reply)

    def stats(self) -> dict:
        """Health and load: what a ping returns."""
        now, cpu = time.monotonic(), time.process_time()
        with self._lock:
            wall0, cpu0 = self._cpu_mark
            self._cpu_mark = (now, cpu)
            cores_used = (cpu - cpu0) / max(now - wall0, 1e-6)
            return {"incarnation": self.incarnation, "fingerprint": self.fingerprint, "vocab_size": self.vocab_size,
                    "method": self.proposer.method, "pid": os.getpid(), "threads": self.threads,
                    "cores": self.cores, "cores_used": cores_used, "cpu_util": min(1.0, cores_used / self.threads),
                    "sequences": len(self._shadows), "queued": self._waiting_real, "calls": self.calls,
                    "spec_hits": self.spec_hits, "spec_misses": self.spec_misses, "spec_skipped": self.spec_skipped,
                    "gaps": self.gaps}

    def info(self) -> dict:
        """What the target needs to know at the handshake: the drafter's shape and identity."""
        p = self.proposer
        return {**self.stats(), "needs_hidden": p.needs_hidden, "aux_layers": list(p.aux_layers),
                "builds_trees": p.builds_trees}

    def drain(self) -> None:
        """Wait until background work queued so far (speculation, warm-ups) has run."""
        self._compute.submit(lambda: None).result()

    def set_fault(self, delay_ms: float = 0.0, garbage: str | None = None) -> None:
        self.fault = Fault(delay_ms, garbage)

    def close(self) -> None:
        self._compute.shutdown(wait=False, cancel_futures=True)
        self.proposer.close()

    # -- the compute thread ------------------------------------------------------------------------

    def _apply_threads(self) -> None:
        if self.threads != self._applied_threads:
            torch.set_num_threads(self.threads)
            self._applied_threads = self.threads

    @torch.inference_mode()
    def _run_call(self, call: DraftCall) -> DraftReply:
        with self._lock:
            self._waiting_real -= 1
        self._apply_threads()
        if self.fault.delay_ms:
            time.sleep(self.fault.delay_ms / 1000)
        t0 = time.perf_counter()
        for rid in call.releases:
            self._release(rid)
        drafts: list[SeqDraft] = []
        todo: list[tuple[SeqUpdate, ShadowSequence]] = []
        warm: list[ShadowSequence] = []
        hits = misses = 0
        for u in call.updates:
            sh = self._apply_update(u)
            if sh is None:
                self.gaps += 1
                known = self._shadows.get(u.rid)
                drafts.append(SeqDraft(u.rid, "resync", len(known.token_ids) if known else 0))
                continue
            for h in u.hidden:
                self.proposer.on_commit(sh, CommittedHidden(h.start, h.final, h.aux))
            if u.budget == 0:
                warm.append(sh)
                drafts.append(SeqDraft(u.rid, "none", len(sh.token_ids)))
                continue
            hit = self._take_speculation(sh, u.budget) if call.pipelining else None
            if hit is not None:
                drafts.append(hit)
                hits += 1
            else:
                misses += call.pipelining
                todo.append((u, sh))
        drafts.extend(self._draft(todo))
        with self._lock:
            self.spec_hits += hits
            self.spec_misses += misses
        budgets = {u.rid: u.budget for u in call.updates}
        ahead = []
        if call.pipelining and not self.proposer.needs_hidden:  # hidden-state drafters cannot see the future
            ahead = [(self._shadows[d.rid], list(d.tokens), budgets[d.rid]) for d in drafts
                     if d.status == "ok" and d.parents is None and d.rid in self._shadows]
        if not call.send_q:  # the target verifies point proposals: q would only cost bytes
            for d in drafts:
                d.q = None
        if self.fault.garbage:
            drafts = [_corrupt(d, self.fault.garbage, budgets.get(d.rid, 1), self.vocab_size) for d in drafts]
        reply = DraftReply(call.call_id, self.incarnation, drafts, time.perf_counter() - t0, hits, misses)
        if ahead:
            self._compute.submit(self._speculate, ahead)
        if warm:
            self._compute.submit(self._warm_up, warm)
        return reply

    def _apply_update(self, u: SeqUpdate) -> ShadowSequence | None:
        """Extend the shadow history; None when the update leaves a gap (the target must resend)."""
        sh = self._shadows.get(u.rid)
        if sh is not None:
            hist = sh.token_ids
            if u.start > len(hist):
                return None
            overlap = hist[u.start:u.start + len(u.tokens)]
            if overlap != u.tokens[:len(overlap)]:  # the target's history only grows: this shadow is wrong
                self._release(u.rid)
                sh = None
            else:
                hist.extend(u.tokens[len(overlap):])
        if sh is None:
            if u.start != 0 or u.sampling is None or not u.tokens:
                return None
            sh = ShadowSequence(u.rid, list(u.tokens), u.sampling, _generator(u.sampling, u.seed, u.rid))
            self._shadows[u.rid] = sh
            while len(self._shadows) > self.max_sequences:
                self._release(next(iter(self._shadows)))
        self._shadows.move_to_end(u.rid)
        return sh

    def _draft(self, todo: list[tuple[SeqUpdate, ShadowSequence]]) -> list[SeqDraft]:
        if not todo:
            return []
        cap = self.proposer.max_budget()
        requests = [DraftRequest(sh, min(u.budget, cap)) for u, sh in todo]
        try:
            trees = self.proposer.propose(requests, SamplingTensors.from_params([sh.params for _, sh in todo]))
            if len(trees) != len(todo):
                raise RuntimeError(f"{len(trees)} drafts for {len(todo)} requests")
        except Exception:
            log.exception("the hosted %s drafter failed", self.proposer.method)
            return [SeqDraft(u.rid, "error", len(sh.token_ids)) for u, sh in todo]
        return [_to_seq_draft(u.rid, sh, tree) for (u, sh), tree in zip(todo, trees)]

    def _take_speculation(self, sh: ShadowSequence, budget: int) -> SeqDraft | None:
        spec = self._spec.pop(sh.request_id, None)
        if spec is None:
            return None
        hist = sh.token_ids
        if len(hist) != spec.base_len + len(spec.expect) or hist[spec.base_len:] != spec.expect:
            return None
        n = min(budget, len(spec.draft))
        q = spec.q[:n] if spec.q is not None else None
        return SeqDraft(sh.request_id, "ok", len(hist), spec.draft[:n], None, q, pipelined=True)

    @torch.inference_mode()
    def _speculate(self, ahead: list[tuple[ShadowSequence, list[int], int]]) -> None:
        with self._lock:
            if self._waiting_real:  # the next step is already here: answering it matters more
                self.spec_skipped += 1
                return
        cap = self.proposer.max_budget()
        hypo = [ShadowSequence(sh.request_id, sh.token_ids + list(d), sh.params, sh.generator) for sh, d, _ in ahead]
        requests = [DraftRequest(h, min(b + 1, cap)) for h, (_, _, b) in zip(hypo, ahead)]
        try:
            trees = self.proposer.propose(requests, SamplingTensors.from_params([h.params for h in hypo]))
        except Exception:
            log.exception("speculative drafting failed (ignored)")
            return
        for (sh, d, _), tree in zip(ahead, trees):
            if tree is None or tree.num_nodes < 3 or self._shadows.get(sh.request_id) is not sh:
                continue
            if not bool((tree.parents == torch.arange(-1, tree.num_nodes - 1)).all()):
                continue  # only a chain's continuation is a single hypothesis
            toks = tree.tokens.tolist()
            q = tree.draft_probs[2:].clone() if tree.draft_probs is not None else None
            self._spec[sh.request_id] = _Speculation(len(sh.token_ids), list(d) + [toks[1]], toks[2:], q)

    @torch.inference_mode()
    def _warm_up(self, shadows: list[ShadowSequence]) -> None:
        """Process new prompts while the target prefills them (the draft itself is discarded)."""
        with self._lock:
            if self._waiting_real:
                return
        live = [sh for sh in shadows if self._shadows.get(sh.request_id) is sh]
        if live:
            try:
                self.proposer.propose([DraftRequest(sh, 1) for sh in live],
                                      SamplingTensors.from_params([sh.params for sh in live]))
            except Exception:
                log.exception("warm-up drafting failed (ignored)")

    def _release(self, rid: str) -> None:
        self._spec.pop(rid, None)
        sh = self._shadows.pop(rid, None)
        if sh is not None:
            self.proposer.on_finish(sh)


def _generator(sampling: SamplingSpec, seed: int | None, rid: str) -> torch.Generator | None:
    if sampling.greedy:
        return None
    g = torch.Generator(device="cpu")
    g.manual_seed(seed if seed is not None else zlib.crc32(f"{rid}:{uuid.uuid4()}".encode()))
    return g


def _to_seq_draft(rid: str, sh: ShadowSequence, tree: DraftTree | None) -> SeqDraft:
    if tree is None or tree.num_nodes < 2:
        return SeqDraft(rid, "none", len(sh.token_ids))
    n = tree.num_nodes
    chain = bool((tree.parents == torch.arange(-1, n - 1)).all())
    q = tree.draft_probs[1:] if tree.draft_probs is not None else None
    return SeqDraft(rid, "ok", len(sh.token_ids), tree.tokens[1:].tolist(),
                    None if chain else tree.parents[1:].tolist(), q)


def _corrupt(d: SeqDraft, kind: str, budget: int, vocab: int) -> SeqDraft:
    """Fault injection: break an answer the way a buggy or hostile worker might."""
    if d.status != "ok":
        return d
    if kind == "lengths":
        d.tokens = d.tokens + [d.tokens[-1]] * (budget + 1)
        d.q = None
    elif kind == "ids":
        d.tokens = [vocab + 7, *d.tokens[1:]]
    elif kind == "nan":
        d.q = torch.full((len(d.tokens), vocab), float("nan"))
    elif kind == "stale":
        d.hist_len += 1
    return d
