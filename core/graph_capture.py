"""How a backend records a forward once and replays it: the capturer seam of :mod:`hyspec.engine.step_graphs`.

A *capturer* turns ``fn`` (a forward that reads only static input buffers and
returns its output tensors) into a replay function plus those outputs, which
every replay overwrites in place.  The CUDA backend's capturer records a
``torch.cuda.CUDAGraph`` (hyspec.backends.cuda_graphs); a backend without one
returns None from ``Backend.graph_capturer()`` and the engine stays eager.

:class:`ReexecutingCapturer` is the structure check for machines without a
GPU, not a speed path: a "replay" runs ``fn`` again under :func:`host_read_guard`
and copies its results into the captured outputs.  A forward that is correct
under it reads nothing but its static buffers (the re-run sees only what
was copied into them), never synchronises with the host (the guard raises
where a CUDA capture would fail) and, with a launch recorder, launches the
same kernels with the same grids and scalars every time (what a recorded
graph replays).
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator, Protocol

import torch

Outputs = Any  # a tensor or a (nested) tuple/list/dict of tensors


class GraphCaptureError(RuntimeError):
    """A captured forward did something a recorded graph cannot replay (a host read, a host-built tensor)."""


class GraphCapturer(Protocol):
    """Records ``fn`` once; the returned replay reruns it on the static buffers and refreshes the outputs."""

    #: a short name for logs and metrics ("cuda_graph", "reexecution")
    kind: str

    def capture(self, fn: Callable[[], Outputs]) -> tuple[Callable[[], None], Outputs]:
        ...


#: Tensor methods that read device data on the host: inside a CUDA capture each is a synchronisation (an error)
_HOST_READS = ("item", "tolist", "__bool__", "__int__", "__float__", "__index__", "cpu", "numpy")
#: factories that copy host data to the device: inside a capture the copy is recorded once, with capture-time data
_HOST_FACTORIES = ("tensor", "as_tensor")


@contextlib.contextmanager
def host_read_guard() -> Iterator[None]:
    """Inside: reading tensor data on the host or building a tensor from host data raises GraphCaptureError.

    Process-wide (it patches ``torch.Tensor``): use it only around a capture on the calling thread.
    """
    def refuse(name: str) -> Callable[..., Any]:
        def raise_(*_args: Any, **_kwargs: Any) -> Any:
            raise GraphCaptureError(f"torch {name} inside a captured forward: a recorded graph would replay the "
                                    "capture-time value (or a CUDA capture fails on the synchronisation)")
        return raise_

    saved_methods = {name: getattr(torch.Tensor, name) for name in _HOST_READS}
    saved_factories = {name: getattr(torch, name) for name in _HOST_FACTORIES}
    try:
        for name in saved_methods:
            setattr(torch.Tensor, name, refuse(f"Tensor.{name}"))
        for name in saved_factories:
            setattr(torch, name, refuse(f"torch.{name}"))
        yield
    finally:
        for name, fn in saved_methods.items():
            setattr(torch.Tensor, name, fn)
        for name, fn in saved_factories.items():
            setattr(torch, name, fn)


def _tensors(outputs: Outputs) -> list[torch.Tensor]:
    if isinstance(outputs, torch.Tensor):
        return [outputs]
    if isinstance(outputs, dict):
        return [t for key in sorted(outputs) for t in _tensors(outputs[key])]
    if isinstance(outputs, (tuple, list)):
        return [t for item in outputs for t in _tensors(item)]
    raise TypeError(f"a captured forward returns tensors, got {type(outputs).__name__}")


class ReexecutingCapturer:
    """Replays by running ``fn`` again under :func:`host_read_guard` (see the module docstring).

    ``launch_recorder``: a context-manager factory yielding a list that collects
    the kernel launches made inside it (tests pass the Triton interpreter's);
    with one, every replay must launch exactly what the capture launched.
    """

    kind = "reexecution"

    def __init__(self, launch_recorder: Callable[[], contextlib.AbstractContextManager[list]] | None = None):
        self.launch_recorder = launch_recorder
        self.replays = 0

    def _run(self, fn: Callable[[], Outputs]) -> tuple[Outputs, list | None]:
        recorder = self.launch_recorder() if self.launch_recorder is not None else contextlib.nullcontext(None)
        with recorder as launches, host_read_guard():
            outputs = fn()
        return outputs, launches

    def capture(self, fn: Callable[[], Outputs]) -> tuple[Callable[[], None], Outputs]:
        outputs, captured_launches = self._run(fn)
        captured = _tensors(outputs)

        def replay() -> None:
            fresh, launches = self._run(fn)
            if captured_launches is not None and launches != captured_launches:
                raise GraphCaptureError("a replay launched different kernels, grids or scalars than the capture")
            fresh_tensors = _tensors(fresh)
            if [t.shape for t in fresh_tensors] != [t.shape for t in captured]:
                raise GraphCaptureError("a replay produced outputs of other shapes than the capture")
            for static, value in zip(captured, fresh_tensors):
                static.copy_(value)
            self.replays += 1

        return replay, outputs


__all__ = ["GraphCaptureError", "GraphCapturer", "ReexecutingCapturer", "host_read_guard"]
