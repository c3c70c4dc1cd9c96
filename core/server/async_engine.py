"""The engine behind asyncio: one thread owns and steps it, requests stream back per request.

``LLMEngine`` is single-threaded.  ``AsyncEngine`` gives it one thread of its
own ("hyspec-engine"): event-loop code hands it commands through a
thread-safe queue (add, abort, stop), and the thread, between steps, applies
them, steps while there is work, and posts each step's outputs back to the
loop in one ``call_soon_threadsafe`` batch, where they land in per-request
``asyncio.Queue``s.  No engine state is touched from the loop thread except
the read-only tokenizer.

Failure rules: a request the engine refuses fails alone (RequestError, 400).
A step that raises fails every request the engine holds (one packed forward
serves the whole batch, so the fault cannot be pinned on one request): they
are aborted, which frees their KV, and get ``EngineStepError`` (500); the
thread lives on.  If even that clean-up fails, the engine is marked failed:
new requests get 503 and ``/health`` says why.

Which thread steps the engine: by default a thread of its own, started by
:meth:`start`.  ``hyspec serve`` instead steps it on the process's main thread
(:meth:`drive_on_this_thread`, ``launcher.run_server``), with uvicorn on a
helper thread: OpenMP (libgomp, which torch and hyspec's C kernels use) keeps
one thread pool per thread that starts parallel regions, and on a 2-core
machine a pool owned by a second Python thread ran every parallel kernel
with futex wake-ups instead of spinning -- measured 4x slower per kernel
call and 1.8x slower decoding than the same engine on the main thread.

Limits: at most ``max_num_seqs`` requests run and ``max_queue`` more wait;
beyond that ``ServerBusyError`` (429).  ``finish_in_flight`` stops taking
requests (503 with a retry hint), lets in-flight ones finish for up to its
timeout and aborts the rest with ``ShutdownAbortError`` (503 too);
``shutdown`` does that and then stops the engine's thread.
"""
from __future__ import annotations

import asyncio
import itertools
import logging
import queue
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from hyspec.engine.outputs import RequestOutput
from hyspec.engine.sampling_params import SamplingParams

if TYPE_CHECKING:
    from hyspec.engine.engine import LLMEngine

log = logging.getLogger(__name__)


class ServerBusyError(Exception):
    """The request queue is full (HTTP 429)."""


#: Seconds a client refused by a draining server is told to wait (Retry-After) before it retries: by then a
#: load balancer has usually moved it to another replica, or the restarted server listens again.
SHUTDOWN_RETRY_AFTER_S = 1


class ServiceUnavailableError(Exception):
    """The server is shutting down or its engine failed (HTTP 503).

    ``retry_after``: seconds after which a retry may succeed (the Retry-After header); None where retrying
    this server cannot help (its engine failed)."""

    def __init__(self, message: str, retry_after: int | None = None):
        super().__init__(message)
        self.retry_after = retry_after


class EngineStepError(Exception):
    """An engine step failed while this request was in it (HTTP 500)."""


class RequestAbortedError(Exception):
    """The request was aborted (its client left, or the server shut down before it finished)."""


class ShutdownAbortError(RequestAbortedError, ServiceUnavailableError):
    """The server shut down before the request finished: an abort that the client sees as a 503."""

    def __init__(self) -> None:
        super().__init__("the server shut down before the request finished", retry_after=SHUTDOWN_RETRY_AFTER_S)


@dataclass(frozen=True)
class EngineStats:
    """A snapshot the engine thread publishes after each step (read by /metrics and /health)."""

    num_waiting: int = 0
    num_running: int = 0
    kv_usage: float = 0.0
    kv_free_pages: int = 0
    kv_total_pages: int = 0
    num_steps: int = 0
    num_step_failures: int = 0
    kv_fragmentation: float = 1.0
    kv_compactions: int = 0
    prefix_cache_queries: int = 0  # prompt tokens looked up in the prefix cache (0 when it is off)
    prefix_cache_hits: int = 0  # of those, found cached


def _prefix_counts(engine: "LLMEngine") -> tuple[int, int]:
    cache = getattr(engine, "prefix_cache", None)
    return (cache.stats.queries, cache.stats.hits) if cache is not None else (0, 0)


class RequestStream:
    """One request's outputs on the event loop; iterate it for ``RequestOutput``s until finished."""

    def __init__(self, request_id: str, owner: "AsyncEngine", loop: asyncio.AbstractEventLoop):
        self.request_id = request_id
        self._owner = owner
        self._queue: asyncio.Queue[RequestOutput | BaseException] = asyncio.Queue()
        self.accepted: asyncio.Future[int] = loop.create_future()
        self.arrival_time = time.monotonic()
        self.first_token_time: float | None = None
        self.finish_time: float | None = None
        self.num_prompt_tokens = 0
        self.num_output_tokens = 0
        self.finish_reason: str | None = None  # "stop" | "length" | "abort" | "error" | "rejected"
        self.arm: str | None = None  # canary arm the engine gave it ("spec" / "control"); None until accepted
        self.error: BaseException | None = None
        self.done = False  # no more items will be pushed
        self._exhausted = False  # the consumer has seen the last item

    def __aiter__(self) -> "RequestStream":
        return self

    async def __anext__(self) -> RequestOutput:
        if self._exhausted:
            raise StopAsyncIteration
        item = await self._queue.get()
        if isinstance(item, BaseException):
            self._exhausted = True
            raise item
        if item.finished:
            self._exhausted = True
        return item

    def abort(self) -> None:
        """Stop generating (client gone); frees the request's KV.  No-op once finished."""
        self._owner._abort(self, RequestAbortedError("request aborted"))

    # -- called on the loop thread by AsyncEngine --

    def _push_output(self, out: RequestOutput) -> None:
        if self.done:
            return  # aborted meanwhile: the engine thread has not seen the abort yet
        if out.new_token_ids and self.first_token_time is None:
            self.first_token_time = time.monotonic()
        self.num_output_tokens = len(out.outputs[0].token_ids)
        self._queue.put_nowait(out)
        if out.finished:
            self._close(out.outputs[0].finish_reason or "stop")

    def _push_error(self, exc: BaseException, reason: str = "error") -> None:
        if not self.accepted.done():
            reason = "rejected" if reason == "error" else reason  # refused before it ever ran
            self.accepted.set_exception(exc)
            self.accepted.exception()  # mark retrieved: the awaiting coroutine may already be gone
        if self.done:
            return
        self.error = exc
        self._queue.put_nowait(exc)
        self._close(reason)

    def _close(self, reason: str) -> None:
        self.done = True
        self.finish_reason = reason
        self.finish_time = time.monotonic()
        self._owner._on_closed(self)


# Commands to the engine thread.
_ADD, _ABORT, _STOP = "add", "abort", "stop"


class AsyncEngine:
    def __init__(self, engine: "LLMEngine", max_queue: int = 256):
        if max_queue < 0:
            raise ValueError(f"max_queue must be >= 0, got {max_queue}")
        self.engine = engine
        self.max_queue = max_queue
        self.capacity = engine.scheduler.config.max_num_seqs + max_queue
        self.stats = EngineStats(kv_free_pages=engine.pool.num_free, kv_total_pages=engine.pool.num_pages)
        self.failed: str | None = None  # why the engine cannot serve any more
        #: called on the loop thread when a request ends (metrics hook it)
        self.on_request_done: Callable[[RequestStream], None] | None = None
        self._commands: queue.SimpleQueue[tuple] = queue.SimpleQueue()
        self._streams: dict[str, RequestStream] = {}  # loop side: requests not yet finished
        self._accepting = True
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        # drive_on_this_thread(): the caller's thread steps the engine instead of a thread of our own
        self._external = False
        self._claimed = False  # claim_driver() ran: a driver is coming even if start() binds first
        self._bound = threading.Event()  # start() has bound the event loop (external mode waits for it)
        self._external_done = threading.Event()  # the external driver's loop returned
        self._idle: asyncio.Event | None = None
        self._ids = itertools.count()
        # engine-thread side
        self._live: dict[str, RequestStream] = {}
        self._outbox: list[tuple[RequestStream, str, Any]] = []
        self._num_steps = 0
        self._num_step_failures = 0

    # -- loop side ---------------------------------------------------------------------------------

    @property
    def num_in_flight(self) -> int:
        return len(self._streams)

    @property
    def num_queued(self) -> int:
        """Requests accepted by the server but not running yet (the engine's waiting queue and the intake)."""
        return max(0, len(self._streams) - self.stats.num_running)

    @property
    def accepting(self) -> bool:
        return self._accepting and self.failed is None

    @property
    def started(self) -> bool:
        return self._thread is not None or self._bound.is_set()

    @property
    def thread_alive(self) -> bool:
        if self._external:
            return self._bound.is_set() and not self._external_done.is_set()
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        """Bind to the running event loop and start the engine thread (idempotent); with
        :meth:`drive_on_this_thread`, bind only: the driving thread starts stepping."""
        loop = asyncio.get_running_loop()
        if self._thread is not None or self._bound.is_set():
            if loop is not self._loop:
                raise RuntimeError("this AsyncEngine is bound to another event loop")
            return
        self._loop = loop
        self._idle = asyncio.Event()
        self._idle.set()
        if not self._external:
            self._thread = threading.Thread(target=self._run, name="hyspec-engine", daemon=True)
            self._thread.start()
        self._bound.set()

    def claim_driver(self) -> None:
        """Declare that a thread will call :meth:`drive_on_this_thread`, so that :meth:`start` binds only.

        Call it before the event loop's thread can reach :meth:`start`: otherwise start() may win the race,
        start an engine thread of its own, and drive_on_this_thread then refuses."""
        if self._thread is not None or self._bound.is_set():
            raise RuntimeError("claim_driver must be called before start()")
        self._external = self._claimed = True

    def drive_on_this_thread(self, keep_waiting: Callable[[], bool]) -> None:
        """Step the engine on the calling thread until shutdown (blocking); call :meth:`claim_driver` before the
        event loop's thread starts, or this before :meth:`start`.

        Waits for :meth:`start` (the app's start-up, on the event loop's thread) while ``keep_waiting()``
        holds -- it turning false (the server thread died during start-up) returns at once.
        """
        if self._thread is not None or (self._bound.is_set() and not self._claimed):
            raise RuntimeError("drive_on_this_thread must be called (or claim_driver) before start()")
        self._external = True
        while not self._bound.wait(0.1):
            if not keep_waiting():
                return
        try:
            self._run()
        finally:
            self._external_done.set()

    def check_capacity(self, count: int = 1) -> None:
        """Raise the 503/429 that adding ``count`` requests now would meet."""
        if self.failed is not None:
            raise ServiceUnavailableError(f"the engine failed and is not serving: {self.failed}")
        if not self._accepting:
            raise ServiceUnavailableError("the server is shutting down and takes no new requests",
                                          retry_after=SHUTDOWN_RETRY_AFTER_S)
        if len(self._streams) + count > self.capacity:
            raise ServerBusyError(f"the server is at capacity ({self.capacity} requests running or queued); "
                                  "retry later")

    async def add_request(self, prompt: Any, params: SamplingParams, request_id: str | None = None) -> RequestStream:
        """Queue a request; returns once the engine has accepted it (or raises what it refused with)."""
        (stream,) = await self.add_requests([(prompt, params, request_id)])
        return stream

    async def add_requests(self, requests: list[tuple]) -> list[RequestStream]:
        """Queue several requests (one engine round trip); all are accepted, or none is and the first error raises.

        Each is ``(prompt, params, request_id)`` or ``(prompt, params, request_id, share_prompt_with)``
        (a sample of an ``n > 1`` request naming the sample whose prefill it shares; LLMEngine.add_request).
        """
        self.check_capacity(len(requests))
        self.start()
        requests = [tuple(r) + (None,) * (4 - len(r)) for r in requests]
        ids = [request_id or f"req-{next(self._ids)}" for _, _, request_id, _ in requests]
        clash = next((i for i in ids if i in self._streams), None) or (None if len(set(ids)) == len(ids) else ids)
        if clash:
            raise ValueError(f"request id(s) {clash!r} already in flight")
        streams = []
        for (prompt, params, _, share), request_id in zip(requests, ids):
            stream = RequestStream(request_id, self, self._loop)
            self._streams[request_id] = stream
            streams.append(stream)
            self._commands.put((_ADD, stream, prompt, params, share))
        self._idle.clear()
        try:
            counts = await asyncio.shield(asyncio.gather(*(s.accepted for s in streams)))
        except BaseException:  # refused, or the client left before the engine took them
            for s in streams:
                s.abort()
            raise
        for s, n in zip(streams, counts):
            s.num_prompt_tokens = n
        return streams

    def _abort(self, stream: RequestStream, error: BaseException) -> None:
        """End ``stream`` now with ``error`` (for any consumer still reading) and free its KV in the engine."""
        if stream.done:
            return
        stream._push_error(error, reason="abort")
        self._commands.put((_ABORT, stream.request_id))

    def _on_closed(self, stream: RequestStream) -> None:
        self._streams.pop(stream.request_id, None)
        if not self._streams and self._idle is not None:
            self._idle.set()
        if self.on_request_done is not None:
            try:
                self.on_request_done(stream)
            except Exception:  # metrics must never break serving
                log.exception("on_request_done hook failed")

    def _deliver(self, batch: list[tuple[RequestStream, str, Any]]) -> None:
        for stream, kind, value in batch:
            if kind == "accepted":
                num_prompt_tokens, stream.arm = value
                if not stream.accepted.done():
                    stream.accepted.set_result(num_prompt_tokens)
            elif kind == "output":
                stream._push_output(value)
            else:
                stream._push_error(value)

    async def drain(self, timeout: float) -> bool:
        """Wait until no request is in flight; False if ``timeout`` seconds passed first."""
        if self._idle is None or not self._streams:
            return True
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
            return True
        except asyncio.TimeoutError:
            return False

    def begin_shutdown(self) -> None:
        """Stop taking new requests (they get 503); in-flight ones continue."""
        self._accepting = False

    async def finish_in_flight(self, timeout: float, give_up: Callable[[], bool] = lambda: False) -> None:
        """Stop taking requests (503), give those in flight up to ``timeout`` s to finish (less once ``give_up()``
        holds), then abort the rest: their clients get ``ShutdownAbortError`` and the engine frees their KV."""
        self.begin_shutdown()
        start = time.monotonic()
        while self._streams and not give_up():
            left = start + timeout - time.monotonic()
            if left <= 0:
                break
            await self.drain(min(left, 0.1))  # in slices, so that give_up() is looked at
        if self._streams:
            log.warning("shutdown: aborting %d request(s) still running after %.1f s", len(self._streams),
                        time.monotonic() - start)
            for stream in list(self._streams.values()):
                self._abort(stream, ShutdownAbortError())

    async def shutdown(self, timeout: float = 30.0) -> None:
        """Graceful stop: :meth:`finish_in_flight`, then stop the engine loop and join its thread."""
        await self.finish_in_flight(timeout)
        if self._thread is not None:
            self._commands.put((_STOP,))
            await asyncio.to_thread(self._thread.join, max(timeout, 5.0))
            if self._thread.is_alive():
                log.error("the engine thread did not stop within %.1f s", max(timeout, 5.0))
        elif self._external and self._bound.is_set():
            self._commands.put((_STOP,))
            if not await asyncio.to_thread(self._external_done.wait, max(timeout, 5.0)):
                log.error("the engine loop did not stop within %.1f s", max(timeout, 5.0))

    # -- engine thread -----------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while self._apply_commands(block=not self.engine.has_unfinished_requests()):
                if self.engine.has_unfinished_requests():
                    self._step()
                self._publish_stats()
                self._flush()
        except BaseException as exc:  # noqa: BLE001 - the loop itself broke: nothing can be served any more
            self.failed = f"{type(exc).__name__}: {exc}"
            log.exception("the engine thread died; the server will answer 503")
            error = EngineStepError(f"the engine failed: {self.failed}")
            for stream in self._live.values():
                self._outbox.append((stream, "error", error))
            self._live.clear()
            while True:  # requests queued behind the failure would otherwise wait forever
                try:
                    command = self._commands.get_nowait()
                except queue.Empty:
                    break
                if command[0] == _ADD:
                    self._outbox.append((command[1], "error", ServiceUnavailableError(error.args[0])))
        finally:
            self._flush()

    def _apply_commands(self, block: bool) -> bool:
        """Apply queued commands (waiting for one if ``block``); False once told to stop."""
        try:
            command = self._commands.get(timeout=1.0) if block else self._commands.get_nowait()
        except queue.Empty:
            return True
        while True:
            kind = command[0]
            if kind == _ADD:
                self._add(*command[1:])
            elif kind == _ABORT:
                self._abort_in_engine(command[1])
            else:
                for rid in list(self._live):
                    self._abort_in_engine(rid, ShutdownAbortError())
                return False
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return True

    def _add(self, stream: RequestStream, prompt: Any, params: SamplingParams, share: str | None = None) -> None:
        if stream.done:
            return  # aborted before the engine saw it
        try:
            seq = self.engine.add_request(prompt, params, stream.request_id, share_prompt_with=share)
        except Exception as exc:  # RequestError and friends: this request alone fails
            self._outbox.append((stream, "error", exc))
            return
        self._live[stream.request_id] = stream
        # The arm travels with the acceptance so that stream fields are only ever written on the loop thread.
        self._outbox.append((stream, "accepted", (seq.num_prompt_tokens, getattr(seq, "arm", None))))

    def _abort_in_engine(self, request_id: str, error: BaseException | None = None) -> None:
        stream = self._live.pop(request_id, None)
        self.engine.abort_request(request_id)
        if stream is not None and error is not None:
            self._outbox.append((stream, "error", error))

    def _step(self) -> None:
        self._num_steps += 1
        try:
            outputs = self.engine.step()
        except Exception as exc:
            self._fail_all_live(exc)
            return
        for out in outputs:
            stream = self._live.get(out.request_id)
            if stream is None:
                continue
            if out.finished:
                del self._live[out.request_id]
            self._outbox.append((stream, "output", out))

    def _fail_all_live(self, exc: Exception) -> None:
        self._num_step_failures += 1
        log.error("engine step failed; failing its %d request(s)", len(self._live), exc_info=exc)
        error = EngineStepError(f"engine step failed: {type(exc).__name__}: {exc}")
        for rid, stream in list(self._live.items()):
            self._outbox.append((stream, "error", error))
            self.engine.abort_request(rid)  # raising here leaves the engine unusable: _run marks it failed
        self._live.clear()
        if self.engine.has_unfinished_requests():
            raise RuntimeError("after a failed step the engine still holds requests the server does not know")

    def _publish_stats(self) -> None:
        sched, pool = self.engine.scheduler, self.engine.pool
        frag = self.engine.fragmentation
        self.stats = EngineStats(len(sched.waiting), len(sched.running), pool.usage(), pool.num_free,
                                 pool.num_pages, self._num_steps, self._num_step_failures, frag.index,
                                 frag.compactions, *_prefix_counts(self.engine))

    def _flush(self) -> None:
        if not self._outbox:
            return
        batch, self._outbox = self._outbox, []
        try:
            self._loop.call_soon_threadsafe(self._deliver, batch)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            log.debug("dropping %d outputs for a closed event loop", len(batch))
