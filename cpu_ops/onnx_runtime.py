"""Run an exported ONNX graph in ONNX Runtime on the CPU: the generic runner every ONNX drafter uses.

ONNX Runtime's CPUExecutionProvider picks its kernels for the instruction
set it finds (AVX-512 / AVX-512-VNNI where present), so nothing here chooses
ISA paths.  What it does choose:

* graph optimisation level ALL (constant folding, MatMul+Add, layer-norm and
  attention fusions; the layout transforms of level ALL are CPU-only, which
  is what this runner is for);
* ``intra_op_num_threads`` from the caller: a drafter shares the node with the
  target, so it must not take every core.  A session's thread pool is fixed
  when the session is built, so ``set_num_threads`` keeps one session per
  thread count (built on first use) and switches between them;
* no spinning by default: idle pool threads sleep instead of busy-waiting
  between calls, which would steal cycles from the target it runs beside.

onnxruntime is imported inside functions only (``import hyspec`` must work
without it); a missing install raises :class:`OnnxUnavailableError` naming the
``cpu`` extra.
"""
from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import torch

from hyspec.errors import HyspecError

CPU_EXTRA_HINT = "pip install 'hyspec[cpu]' (installs onnxruntime and onnx)"


class OnnxUnavailableError(HyspecError):
    """onnxruntime or onnx is not installed (or its import fails)."""


def import_onnxruntime() -> Any:
    """The ``onnxruntime`` module, or an OnnxUnavailableError that says how to get it."""
    try:
        import onnxruntime
    except ImportError as exc:
        raise OnnxUnavailableError(f"onnxruntime is needed to run ONNX drafters and cannot be imported ({exc}); "
                                   f"{CPU_EXTRA_HINT}") from None
    return onnxruntime


def import_onnx() -> Any:
    """The ``onnx`` module (export and model metadata), or an OnnxUnavailableError."""
    try:
        import onnx
    except ImportError as exc:
        raise OnnxUnavailableError(f"onnx is needed to export drafters and cannot be imported ({exc}); "
                                   f"{CPU_EXTRA_HINT}") from None
    return onnx


def _check_threads(num_threads: int | None) -> None:
    if num_threads is not None and (isinstance(num_threads, bool) or not isinstance(num_threads, int)
                                    or num_threads < 1):
        raise HyspecError(f"num_threads must be a positive int or None (ONNX Runtime's default), got {num_threads!r}")


class OnnxModule:
    """An ONNX graph in ONNX Runtime (CPU), called with torch tensors or numpy arrays.

    ``source`` is a path to a ``.onnx`` file or the serialized model bytes.
    ``module(*inputs)`` feeds the graph inputs in their declared order and
    returns the outputs as torch tensors in their declared order;
    ``module.run({name: value})`` does the same by name and returns a dict.
    """

    def __init__(self, source: str | Path | bytes, num_threads: int | None = None, *, spin: bool = False):
        _check_threads(num_threads)
        self._ort = import_onnxruntime()
        if isinstance(source, (bytes, bytearray)):
            self._model: bytes | str = bytes(source)
        else:
            path = Path(source)
            if not path.is_file():
                raise HyspecError(f"ONNX model {path} does not exist")
            self._model = str(path)
        self._spin = spin
        self._sessions: dict[int | None, Any] = {}
        self._lock = threading.Lock()
        self.num_threads = num_threads
        session = self._session(num_threads)
        self.input_names: tuple[str, ...] = tuple(i.name for i in session.get_inputs())
        self.output_names: tuple[str, ...] = tuple(o.name for o in session.get_outputs())
        self._input_types = {i.name: i.type for i in session.get_inputs()}
        #: declared shape of each input: ints for static axes, names (str) for dynamic ones
        self.input_shapes: dict[str, tuple[int | str, ...]] = {i.name: tuple(i.shape) for i in session.get_inputs()}

    @property
    def metadata(self) -> dict[str, str]:
        """The model's ``metadata_props`` (e.g. the weight hash an export was made from)."""
        return dict(self._session(self.num_threads).get_modelmeta().custom_metadata_map)

    def set_num_threads(self, num_threads: int | None) -> None:
        """Use ``num_threads`` intra-op threads from the next call on (a session per count, cached)."""
        _check_threads(num_threads)
        self._session(num_threads)
        self.num_threads = num_threads

    def _session(self, num_threads: int | None) -> Any:
        with self._lock:
            session = self._sessions.get(num_threads)
            if session is None:
                ort = self._ort
                options = ort.SessionOptions()
                options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
                options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
                options.inter_op_num_threads = 1  # one graph at a time: parallelism is inside the ops
                if num_threads is not None:
                    options.intra_op_num_threads = num_threads
                options.add_session_config_entry("session.intra_op.allow_spinning", "1" if self._spin else "0")
                try:
                    session = ort.InferenceSession(self._model, options, providers=["CPUExecutionProvider"])
                except Exception as exc:  # a corrupt or foreign file: say which, not ORT's internals only
                    what = "the given model bytes" if isinstance(self._model, bytes) else self._model
                    raise HyspecError(f"ONNX Runtime cannot load {what}: {exc}") from None
                self._sessions[num_threads] = session
            return session

    def run(self, inputs: Mapping[str, torch.Tensor | np.ndarray],
            outputs: Sequence[str] | None = None) -> dict[str, torch.Tensor]:
        """Run the graph; ``inputs`` must name every graph input."""
        missing = [n for n in self.input_names if n not in inputs]
        extra = [n for n in inputs if n not in self._input_types]
        if missing or extra:
            raise HyspecError(f"ONNX inputs: missing {missing}, unknown {extra}; the graph takes {list(self.input_names)}")
        feed = {name: _to_numpy(value) for name, value in inputs.items()}
        names = list(outputs) if outputs is not None else list(self.output_names)
        results = self._session(self.num_threads).run(names, feed)
        return {name: torch.from_numpy(np.ascontiguousarray(r)) for name, r in zip(names, results)}

    def run_numpy(self, feed: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        """The raw ONNX Runtime call (numpy in, numpy out, every output): no conversion overhead."""
        return self._session(self.num_threads).run(None, dict(feed))

    def __call__(self, *inputs: torch.Tensor | np.ndarray) -> tuple[torch.Tensor, ...]:
        if len(inputs) != len(self.input_names):
            raise HyspecError(f"the ONNX graph takes {len(self.input_names)} inputs {list(self.input_names)}, "
                              f"got {len(inputs)}")
        out = self.run(dict(zip(self.input_names, inputs)))
        return tuple(out[name] for name in self.output_names)


def _to_numpy(value: torch.Tensor | np.ndarray) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().contiguous().numpy()
    return np.ascontiguousarray(value)


__all__ = ["CPU_EXTRA_HINT", "OnnxModule", "OnnxUnavailableError", "import_onnx", "import_onnxruntime"]
