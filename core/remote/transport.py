"""How the target reaches a worker: a handle whose calls return pending results.

Two implementations share one contract: :class:`RayHandle` (a Ray actor on
some node; ``hyspec.remote.worker``) and :class:`InProcessHandle` (a
:class:`~hyspec.remote.host.DraftHost` on threads of this process: tests,
and a way to exercise the whole protocol without a cluster).  Every call is
non-blocking; ``Pending.result(timeout)`` raises ``TimeoutError`` when the
answer is late and :class:`WorkerGone` when the worker cannot answer (dead,
restarting, raised).
"""
from __future__ import annotations

import itertools
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Protocol

from hyspec.errors import HyspecError


class WorkerGone(HyspecError):
    """The worker died, is restarting, or its call raised."""


class RemoteUnavailable(HyspecError):
    """Remote drafting cannot start: no Ray, an unreachable address, no worker node."""


class Pending(Protocol):
    def done(self) -> bool: ...

    def result(self, timeout: float | None) -> Any: ...


class WorkerHandle(Protocol):
    name: str

    def draft(self, payload: bytes) -> Pending: ...

    def ping(self) -> Pending: ...

    def info(self) -> Pending: ...

    def set_fault(self, delay_ms: float = 0.0, garbage: str | None = None) -> Pending: ...

    def pid(self, timeout: float) -> int: ...

    def kill(self) -> None: ...

    def runtime_up(self) -> bool:
        """Whether the runtime the worker lives in is there at all (Ray still running in this process).

        False is final for the handle: nothing it sends can arrive any more (unlike a dead worker,
        which the runtime restarts)."""
        ...


def runtime_up(handle: WorkerHandle) -> bool:
    """``handle.runtime_up()``; a handle without the method (written against an older protocol) counts as up."""
    check = getattr(handle, "runtime_up", None)
    return True if check is None else bool(check())


class FuturePending:
    def __init__(self, future: Future):
        self._future = future

    def done(self) -> bool:
        return self._future.done()

    def result(self, timeout: float | None) -> Any:
        try:
            return self._future.result(timeout)
        except TimeoutError:
            raise
        except Exception as exc:
            raise WorkerGone(f"{type(exc).__name__}: {exc}") from exc


class InProcessHandle:
    """A DraftHost served from this process's threads; ``kill``/``restart`` simulate a worker dying."""

    _ids = itertools.count()

    def __init__(self, make_host: Callable[[], Any], name: str | None = None):
        self.name = name or f"inproc-{next(self._ids)}"
        self._make_host = make_host
        self.host = make_host()
        self.alive = True
        self._pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix=self.name)

    def _submit(self, fn: Callable[..., Any], *args: Any) -> FuturePending:
        def call() -> Any:
            if not self.alive:
                raise WorkerGone(f"{self.name} is dead")
            return fn(*args)

        return FuturePending(self._pool.submit(call))

    def draft(self, payload: bytes) -> FuturePending:
        return self._submit(lambda: self.host.handle(payload))

    def ping(self) -> FuturePending:
        return self._submit(lambda: self.host.stats())

    def info(self) -> FuturePending:
        return self._submit(lambda: self.host.info())

    def set_fault(self, delay_ms: float = 0.0, garbage: str | None = None) -> FuturePending:
        return self._submit(lambda: self.host.set_fault(delay_ms, garbage))

    def pid(self, timeout: float) -> int:
        import os

        return os.getpid()

    def kill(self) -> None:
        self.alive = False
        self.host.close()

    def restart(self) -> None:
        """A new incarnation with empty state, like Ray restarting a killed actor."""
        self.host = self._make_host()
        self.alive = True

    def close(self) -> None:
        self.kill()
        self._pool.shutdown(wait=False, cancel_futures=True)

    def runtime_up(self) -> bool:
        return True  # this process's own threads


class RayPending:
    def __init__(self, ref: Any):
        self.ref = ref

    def done(self) -> bool:
        import ray

        ready, _ = ray.wait([self.ref], timeout=0, fetch_local=False)
        return bool(ready)

    def result(self, timeout: float | None) -> Any:
        import ray
        from ray.exceptions import GetTimeoutError

        try:
            return ray.get(self.ref, timeout=timeout)
        except GetTimeoutError:
            raise TimeoutError(f"no answer within {timeout} s") from None
        except Exception as exc:  # RayActorError, ActorUnavailableError, RayTaskError, ...
            raise WorkerGone(f"{type(exc).__name__}: {exc}") from exc


class RayHandle:
    def __init__(self, actor: Any, name: str):
        self.actor = actor
        self.name = name

    def draft(self, payload: bytes) -> RayPending:
        return RayPending(self.actor.draft.remote(payload))

    def ping(self) -> RayPending:
        return RayPending(self.actor.ping.remote())

    def info(self) -> RayPending:
        return RayPending(self.actor.info.remote())

    def set_fault(self, delay_ms: float = 0.0, garbage: str | None = None) -> RayPending:
        return RayPending(self.actor.set_fault.remote(delay_ms, garbage))

    def pid(self, timeout: float) -> int:
        return int(self.ping().result(timeout)["pid"])

    def kill(self) -> None:
        import ray

        try:
            ray.kill(self.actor, no_restart=True)
        except Exception:  # already gone, or Ray already shut down
            pass

    def close(self) -> None:
        self.kill()

    def runtime_up(self) -> bool:
        import ray

        return ray.is_initialized()
