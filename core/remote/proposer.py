"""``draft_placement: "remote"``: a Proposer whose drafts come from CPU workers on a Ray cluster.

Each step, :meth:`RemoteProposer.propose` routes every sequence to a worker
that is up (or, during a failover, to the local fallback proposer), sends
each worker one call with the sequences' newly committed tokens, drafts the
locally routed sequences while the workers compute, and waits for the
answers until the step's deadline (``remote.draft_deadline_ms`` after the
call began).  What comes back is validated at the protocol level
(:func:`~hyspec.remote.protocol.draft_to_tree`) before the decoder
validates the trees again; anything unusable -- late, garbled, stale, from
a worker for another target -- leaves that sequence without a draft, so the
step is a plain step for it: it costs speed, never a token or a request.
One worker's garbage costs only its own sequences' drafts.  Unless
``remote.trust_worker_q`` is set, a worker's q is not used: its drafts are
verified as point proposals, so a worker cannot bias sampled output.

Counted: ``draft_timeout`` in the engine's speculative metrics for drafts
lost to the deadline, and everything else in :class:`RemoteMetrics`.
``health()`` is the ``remote_health`` signal of the hybrid dispatcher.
"""
from __future__ import annotations

import atexit
import functools
import itertools
import logging
import threading
import time
import weakref
import zlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from hyspec.ops.sampling import SamplingTensors
from hyspec.remote.health import UP, HealthMonitor, WorkerSlot
from hyspec.remote.metrics import RemoteMetrics
from hyspec.remote.protocol import (DraftCall, HiddenBlock, ProtocolError, SamplingSpec, SeqUpdate, decode_reply,
                                    draft_to_tree, encode_call)
from hyspec.remote.scheduler import BusyMeter, ThreadPolicy, ThreadScheduler
from hyspec.remote.transport import Pending, WorkerGone, WorkerHandle, runtime_up
from hyspec.remote.wire import WireError
from hyspec.remote.worker import DEFAULT_WORKER_KV_BYTES, vocab_fingerprint
from hyspec.seam.proposer import CommittedHidden, DraftRequest, Proposer
from hyspec.seam.tree import DraftTree

if TYPE_CHECKING:
    from hyspec.seam.target import TargetContext
    from hyspec.drafters.methods import MethodSpec

log = logging.getLogger(__name__)

# A late call blocks new calls to its worker (no pile-up in a slow worker's queue) for at most this many
# deadlines: past that it is presumed lost, and the next call's gap makes the worker ask for a resync.
ABANDON_LATE_CALL_DEADLINES = 10


@dataclass(frozen=True)
class RemoteOptions:
    """Deployment knobs that are not part of ``speculative_config``."""

    num_workers: int | None = None  # None = one per node offering the worker resource (1 on a local Ray)
    startup_timeout_s: float = 120.0  # actor start + drafter load; a worker later than this joins when it answers
    worker_kv_cache_bytes: int = DEFAULT_WORKER_KV_BYTES
    worker_dtype: str = "float32"
    fixed_threads: int | None = None  # a fixed per-worker thread cap instead of the adaptive scheduler
    rejoin_after: int = 2  # consecutive good pings before a failed-over worker drafts again
    warm_up: bool = True  # send prompts of sequences still in prefill so workers process them early

    def __post_init__(self) -> None:
        if self.num_workers is not None and self.num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {self.num_workers}")
        if self.startup_timeout_s <= 0 or self.rejoin_after < 1:
            raise ValueError("startup_timeout_s must be > 0 and rejoin_after >= 1")


class RemoteProposer(Proposer):
    def __init__(self, target: TargetContext, spec: MethodSpec, fallback: Proposer | None,
                 handles: list[WorkerHandle], options: RemoteOptions | None = None,
                 metrics: RemoteMetrics | None = None):
        options = options or RemoteOptions()
        rc = spec.remote
        self.method = spec.method
        self.vocab_size = target.vocab_size
        self.max_tokens = spec.num_speculative_tokens
        self.fallback = fallback
        self.pipelining = rc.pipelining
        self.trust_q = rc.trust_worker_q  # else drafts are point proposals and workers are asked not to send q
        self.deadline_s = rc.draft_deadline_ms / 1000
        self.max_missed = rc.max_missed_pings
        self.options = options
        self.metrics = metrics or RemoteMetrics(spec.method)
        self.policy = ThreadPolicy(rc.busy_threshold, rc.min_cores, options.fixed_threads)
        self.busy = BusyMeter()
        tokenizer = target.tokenizer
        self._fingerprint = vocab_fingerprint(tokenizer) if tokenizer is not None else None
        self._prefilling: list[Any] = []  # this step's prefilling sequences (on_prefill), warmed on a call
        self._faults: dict[str, int] = {}
        self._lock = threading.Lock()
        self.slots = [WorkerSlot(h) for h in handles]
        self._assign: dict[str, WorkerSlot] = {}
        self._hidden: dict[str, list[HiddenBlock]] = {}
        self._inflight: dict[str, tuple[Pending, float, DraftCall]] = {}  # worker -> (late call, since, call)
        self._call_ids = itertools.count()
        self._warned: set[str] = set()
        # a partial, not a bound method: the monitor's thread must not keep this proposer alive
        compatible = functools.partial(incompatibility, self.method, self.vocab_size, self._fingerprint)
        self.monitor = HealthMonitor(self.slots, self._lock, self.metrics, rc.ping_interval_ms / 1000,
                                     rc.max_missed_pings, compatible, options.rejoin_after)
        remote = self._handshake(options.startup_timeout_s)
        self._remote_needs_hidden = any(i.get("needs_hidden") for i in remote)
        self.needs_hidden = self._remote_needs_hidden or bool(fallback and fallback.needs_hidden)
        self.aux_layers = tuple(sorted({*(layer for i in remote for layer in i.get("aux_layers", ())),
                                        *(fallback.aux_layers if fallback else ())}))
        self.builds_trees = any(i.get("builds_trees") for i in remote)
        self.monitor.start()
        self._shutdown_args = (self.monitor, list(handles), fallback)
        self._finalizer = weakref.finalize(self, _shutdown_soon, *self._shutdown_args)
        # At interpreter exit the health thread must stop before Ray shuts down: Ray's own exit hook
        # was registered by ray.init (before this proposer existed), and exit hooks run last-in
        # first-out, so this one runs first. weakref.finalize's exit hook may predate ray.init and run
        # after it (seen: the health thread's ray.wait on a dead session, then SIGSEGV at exit).
        self._close_at_exit = _closer(weakref.ref(self))
        atexit.register(self._close_at_exit)

    # -- setup -------------------------------------------------------------------------------------

    def _handshake(self, timeout_s: float) -> list[dict]:
        pending = []
        for slot in self.slots:
            try:
                pending.append((slot, slot.handle.info()))
            except Exception as exc:
                log.error("draft worker %s unreachable: %s", slot.name, exc)
        deadline = time.monotonic() + timeout_s
        infos = []
        for slot, p in pending:
            try:
                info = p.result(max(0.0, deadline - time.monotonic()))
            except (TimeoutError, WorkerGone) as exc:
                log.error("draft worker %s did not start (%s); drafting locally until it answers", slot.name, exc)
                continue
            self.monitor.ok(slot, info)
            if slot.state == UP:
                infos.append(info)
        return infos

    # -- Proposer ----------------------------------------------------------------------------------

    def max_budget(self) -> int:
        return self.max_tokens

    def health(self) -> float:
        """``remote_health`` in [0, 1]: mean over workers of (up) x (missed-ping margin) x (on-time rate)."""
        with self._lock:
            if not self.slots:
                return 0.0
            return sum(s.score(self.max_missed) for s in self.slots) / len(self.slots)

    def observe_forward(self, seconds: float) -> None:
        """Target forward time of the last step (optional engine hook; sharpens the busy estimate)."""
        self.busy.observe_forward(seconds)

    def propose(self, requests: list[DraftRequest], sampling: SamplingTensors) -> list[DraftTree | None]:
        start = time.perf_counter()
        out: list[DraftTree | None] = [None] * len(requests)
        local: list[int] = []
        busy_workers: list[int] = []
        with self._lock:
            groups: dict[str, tuple[WorkerSlot, list[int]]] = {}
            for i, req in enumerate(requests):
                slot = self._route(req.seq)
                if slot is None:
                    local.append(i)
                elif self._still_busy(slot):
                    busy_workers.append(i)
                else:
                    groups.setdefault(slot.name, (slot, []))[1].append(i)
            calls = [(slot, idx, self._build_call(slot, idx, requests)) for slot, idx in groups.values()]
        if busy_workers:  # the worker is still on a late call: this step is plain for its sequences
            self._lost_to_deadline(len(busy_workers))
        submitted = []
        for slot, idx, call in calls:
            payload = encode_call(call)
            t = time.perf_counter()
            try:
                submitted.append((slot, idx, call, slot.handle.draft(payload), len(payload), t))
            except Exception as exc:
                self._call_failed(slot, call, exc)
        if submitted:
            self.metrics.add("calls", len(submitted))
            self.metrics.add("steps")
        if local:
            self._propose_local(requests, sampling, local, out)
            for i in local:
                self._hidden.pop(requests[i].seq.request_id, None)
        deadline = start + self.deadline_s
        for slot, idx, call, pending, nbytes, t in submitted:
            try:
                data = pending.result(max(0.0, deadline - time.perf_counter()))
            except TimeoutError:
                self._inflight[slot.name] = (pending, time.perf_counter(), call)
                slot.note_call(timed_out=True)
                self._lost_to_deadline(len(idx))
                continue
            except WorkerGone as exc:
                self._call_failed(slot, call, exc)
                continue
            slot.note_call(timed_out=False)
            self.metrics.observe_call(time.perf_counter() - t, nbytes, len(data))
            self._accept(slot, idx, call, requests, data, out)
        self.busy.on_draft(start, time.perf_counter())
        self.metrics.target_busy = self.busy.value
        self.metrics.health = self.health()
        return out

    def on_commit(self, seq: Any, hidden: CommittedHidden | None) -> None:
        if self.fallback is not None and self.fallback.needs_hidden:
            self.fallback.on_commit(seq, hidden)
        if self._remote_needs_hidden and hidden is not None:
            self._hidden.setdefault(seq.request_id, []).append(HiddenBlock(hidden.start, hidden.final, hidden.aux))

    def on_finish(self, seq: Any) -> None:
        rid = seq.request_id
        with self._lock:
            slot = self._assign.pop(rid, None)
            if slot is not None:
                slot.assigned -= 1
                slot.sent.pop(rid, None)
                slot.releases.append(rid)
        self._hidden.pop(rid, None)
        if self.fallback is not None:
            self.fallback.on_finish(seq)

    def on_preempt(self, seq: Any) -> None:
        # The target recomputes its KV; the history (all a worker holds) is unchanged.
        if self.fallback is not None:
            self.fallback.on_preempt(seq)

    def on_prefill(self, seqs: list[Any]) -> None:
        self._prefilling = list(seqs)
        if self.fallback is not None:
            self.fallback.on_prefill(seqs)

    def take_faults(self) -> dict[str, int]:
        with self._lock:
            faults, self._faults = self._faults, {}
        return faults

    def close(self) -> None:
        atexit.unregister(self._close_at_exit)
        if self._finalizer.detach() is not None:  # not closed yet (by an earlier close or the collector)
            _shutdown(*self._shutdown_args)

    def register_prometheus(self, registry: Any = None) -> Any:
        return self.metrics.register_prometheus(registry)

    # -- routing and calls (under the lock) --------------------------------------------------------

    def _route(self, seq: Any) -> WorkerSlot | None:
        rid = seq.request_id
        slot = self._assign.get(rid)
        if slot is not None and slot.state == UP:
            return slot
        up = [s for s in self.slots if s.state == UP]
        if not up:
            return None  # failover: local drafting; the assignment is kept for the rejoin
        best = min(up, key=lambda s: s.assigned)
        if slot is not None:
            slot.assigned -= 1
            slot.sent.pop(rid, None)
            slot.releases.append(rid)
        best.assigned += 1
        self._assign[rid] = best
        return best

    def _still_busy(self, slot: WorkerSlot) -> bool:
        late = self._inflight.get(slot.name)
        if late is None:
            return False
        pending, since, call = late
        if pending.done():
            del self._inflight[slot.name]
            self._learn_from_late(slot, call, pending)
            return False
        waited = time.perf_counter() - since + self.deadline_s  # since the call went out
        if waited > (ABANDON_LATE_CALL_DEADLINES + 1) * self.deadline_s:
            del self._inflight[slot.name]
            if slot.scheduler is not None:  # a lower bound of its cost is still a lesson
                slot.scheduler.observe(call.threads, waited, sum(u.budget for u in call.updates), abandoned=True)
            return False
        return True

    def _learn_from_late(self, slot: WorkerSlot, call: DraftCall, pending: Pending) -> None:
        """A late answer's drafts are stale, but its compute time still teaches the thread scheduler."""
        try:
            reply, raws = decode_reply(pending.result(0))
        except Exception:  # gone, or garbage: nothing to learn
            return
        if slot.scheduler is not None and reply.call_id == call.call_id:
            fresh = sum(len(r.tokens) for r in raws.values() if r.status == "ok" and not r.pipelined)
            slot.scheduler.observe(call.threads, reply.worker_seconds, fresh)

    def _build_call(self, slot: WorkerSlot, idx: list[int], requests: list[DraftRequest]) -> DraftCall:
        updates = [self._update(slot, requests[i].seq, requests[i].budget) for i in idx]
        if self.options.warm_up:
            updates += [self._update(slot, seq, 0) for seq in self._warm_candidates(slot)]
        scheduler = slot.scheduler
        if scheduler is None or scheduler.cores != slot.cores:  # new, or restarted on another node
            scheduler = slot.scheduler = ThreadScheduler(self.policy, slot.cores)
        slot.threads = scheduler.choose(self.busy.value, len(idx))
        releases, slot.releases = slot.releases, []
        return DraftCall(next(self._call_ids), updates, releases, self.pipelining, slot.threads,
                         send_q=self.trust_q)

    def _update(self, slot: WorkerSlot, seq: Any, budget: int) -> SeqUpdate:
        rid, hist = seq.request_id, seq.token_ids
        sent = slot.sent.get(rid, 0)
        if sent > len(hist):
            sent = 0
        first = sent == 0
        seed = None
        if first and seq.params.seed is not None:  # reproducible drafts for seeded requests
            seed = zlib.crc32(f"{seq.params.seed}:{rid}".encode())
        update = SeqUpdate(rid, sent, hist[sent:], budget, SamplingSpec.from_params(seq.params) if first else None,
                           seed, self._hidden.pop(rid, []))
        slot.sent[rid] = len(hist)
        return update

    def _warm_candidates(self, slot: WorkerSlot) -> list[Any]:
        """Sequences still in prefill, not yet known to any worker, routed to ``slot``."""
        out = []
        for seq in self._prefilling:
            if seq.in_prefill and seq.request_id not in self._assign:
                if self._route(seq) is slot:
                    out.append(seq)
        return out

    # -- answers -----------------------------------------------------------------------------------

    def _accept(self, slot: WorkerSlot, idx: list[int], call: DraftCall, requests: list[DraftRequest],
                data: bytes, out: list[DraftTree | None]) -> None:
        try:
            reply, raws = decode_reply(data)
            if reply.call_id != call.call_id:
                raise ProtocolError("stale", f"answer to call {reply.call_id}, expected {call.call_id}")
        except (WireError, ProtocolError) as exc:
            self._invalid(getattr(exc, "kind", "bytes"), len(idx), slot, exc)
            return
        fresh = sum(len(r.tokens) for r in raws.values() if r.status == "ok" and not r.pipelined)
        if slot.scheduler is not None:
            slot.scheduler.observe(call.threads, reply.worker_seconds, fresh)
        for i in idx:
            req = requests[i]
            seq = req.seq
            raw = raws.get(seq.request_id)
            if raw is None:
                self._invalid("missing", 1, slot, f"no draft for request {seq.request_id}")
            elif raw.status == "resync":
                with self._lock:
                    if self._assign.get(seq.request_id) is slot:
                        slot.sent.pop(seq.request_id, None)  # the next call resends the whole history
                self.metrics.add("resyncs")
            elif raw.status == "error":
                self.metrics.add("worker_errors")
            elif raw.status == "ok":
                try:
                    out[i] = draft_to_tree(raw, seq.last_token, len(seq.token_ids), req.budget, req.greedy,
                                           self.vocab_size, self.trust_q)
                except ProtocolError as exc:
                    self._invalid(exc.kind, 1, slot, exc)
                    continue
                self.metrics.add_drafts("pipelined" if raw.pipelined else "remote", 1)

    def _propose_local(self, requests: list[DraftRequest], sampling: SamplingTensors, idx: list[int],
                       out: list[DraftTree | None]) -> None:
        if self.fallback is None:
            return
        cap = self.fallback.max_budget()
        sub = [DraftRequest(requests[i].seq, min(requests[i].budget, cap)) for i in idx]
        try:
            trees = self.fallback.propose(sub, sampling.select(idx))
        except Exception:
            log.exception("the local fallback drafter failed: plain step for %d sequences", len(idx))
            return
        for i, tree in zip(idx, trees):
            out[i] = tree
        self.metrics.add_drafts("fallback", sum(t is not None for t in trees))

    def _lost_to_deadline(self, count: int) -> None:
        self.metrics.add("draft_timeouts", count)
        with self._lock:
            self._faults["draft_timeout"] = self._faults.get("draft_timeout", 0) + count

    def _call_failed(self, slot: WorkerSlot, call: DraftCall, exc: Exception) -> None:
        """The worker could not take or answer the call: what it holds is unknown, so resend histories."""
        if not runtime_up(slot.handle):  # Ray went away under us: one warning for all of it (the monitor's)
            self.monitor.runtime_lost(f"a draft call to {slot.name} failed: {type(exc).__name__}")
            return
        self.metrics.add("worker_errors")
        with self._lock:
            for u in call.updates:
                if self._assign.get(u.rid) is slot:
                    slot.sent.pop(u.rid, None)
            slot.releases.extend(call.releases)
        self._warn(f"call:{slot.name}", "draft call to %s failed: %s", slot.name, exc)

    def _invalid(self, kind: str, count: int, slot: WorkerSlot, why: Any) -> None:
        self.metrics.add_invalid(kind, count)
        self._warn(f"{kind}:{slot.name}", "draft worker %s sent an unusable answer (%s): %s", slot.name, kind, why)

    def _warn(self, key: str, msg: str, *args: Any) -> None:
        """Warn once per problem and worker; later occurrences are counted and logged at debug level."""
        level = logging.DEBUG if key in self._warned else logging.WARNING
        self._warned.add(key)
        log.log(level, msg, *args)


def _closer(ref: "weakref.ReferenceType[RemoteProposer]"):
    """An exit hook that closes the proposer if it is still alive (it holds only a weak reference)."""
    def close_at_exit() -> None:
        proposer = ref()
        if proposer is not None:
            proposer.close()

    return close_at_exit


def _shutdown_soon(monitor: HealthMonitor, handles: list[WorkerHandle], fallback: Proposer | None) -> None:
    """The collector's path: inline, unless the collector runs on this proposer's own health thread.

    Garbage collection runs finalizers on whichever thread allocates.  The health thread holds the
    monitor but not the proposer, so the proposer can be collected while that thread is inside a
    worker pool's ``ThreadPoolExecutor.submit`` with the pool's lock held; closing that pool there
    waits on the lock forever (seen: a test run hung).  So from that thread the shutdown moves to a
    thread of its own; from any other (the main thread at exit included) it runs inline, as before.
    """
    if threading.current_thread() is not monitor._thread:
        _shutdown(monitor, handles, fallback)
        return
    try:
        threading.Thread(target=_shutdown, args=(monitor, handles, fallback), name="hyspec-remote-shutdown",
                         daemon=True).start()
    except RuntimeError:  # no new thread at interpreter shutdown: nothing else runs then
        _shutdown(monitor, handles, fallback)


def _shutdown(monitor: HealthMonitor, handles: list[WorkerHandle], fallback: Proposer | None) -> None:
    monitor.stop()
    for h in handles:
        close = getattr(h, "close", None) or getattr(h, "kill")
        close()
    if fallback is not None:
        fallback.close()


def incompatibility(method: str, vocab_size: int, fingerprint: str | None, stats: dict) -> str | None:
    """Why a worker (as its ping/info ``stats`` describe it) cannot draft for this target, or None."""
    if stats.get("method") != method:
        return f"it hosts {stats.get('method')!r}, this proposer is {method!r}"
    if stats.get("vocab_size") != vocab_size:
        return f"it drafts over {stats.get('vocab_size')} tokens, the target has {vocab_size}"
    theirs = stats.get("fingerprint")
    if theirs is not None and fingerprint is not None and theirs != fingerprint:
        return (f"its drafter's tokenizer differs from the target's (vocabulary fingerprint {theirs} "
                f"!= {fingerprint}): a drafter for another target")
    return None
