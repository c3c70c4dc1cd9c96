"""torch module -> ONNX bytes, with metadata, for ONNX Runtime drafters.

Two exporters exist in torch 2.13:

* ``"torchscript"`` (``torch.onnx.export(..., dynamo=False)``): traces the
  module once; dynamic axes come from ``dynamic_axes``.  Needs only torch and
  onnx, so it is the default: it is what the ``cpu`` extra can always run.
* ``"dynamo"`` (``torch.export``-based, torch's default since 2.9): needs the
  ``onnxscript`` package, which the ``cpu`` extra does not install.  Asking for
  it without onnxscript is a clear error, not a silent fall-back.  Checked with
  torch 2.13 + onnxscript 0.7.2: the draft-model graph (opset 18) gives the same
  logits as the torchscript export within 2e-7, but exports ~10x slower.

Metadata (``metadata_props``) records what an export was made from (the
weights' hash, the exporter, hyspec's version), so a cached file made from
other weights is detected and rebuilt instead of silently used.
"""
from __future__ import annotations

import hashlib
import inspect
import io
import os
import tempfile
import warnings
from pathlib import Path
from typing import Iterable, Mapping, Sequence

import torch
from torch import nn

from hyspec import __version__
from hyspec.cpu_ops.onnx_runtime import CPU_EXTRA_HINT, OnnxUnavailableError, import_onnx
from hyspec.errors import HyspecError

EXPORTERS = ("torchscript", "dynamo")
DEFAULT_OPSET = 17
DYNAMO_MIN_OPSET = 18
META_EXPORTER = "hyspec.exporter"
META_VERSION = "hyspec.version"


def export_onnx(
    module: nn.Module,
    args: tuple[torch.Tensor, ...],
    input_names: Sequence[str],
    output_names: Sequence[str],
    dynamic_axes: Mapping[str, Mapping[int, str]],
    *,
    metadata: Mapping[str, str] | None = None,
    exporter: str = "torchscript",
    opset: int = DEFAULT_OPSET,
) -> bytes:
    """The serialized ONNX model of ``module(*args)`` with ``metadata`` in its ``metadata_props``."""
    if exporter not in EXPORTERS:
        raise HyspecError(f"exporter must be one of {EXPORTERS}, got {exporter!r}")
    onnx = import_onnx()
    module = module.eval()
    buffer = io.BytesIO()
    with torch.no_grad(), warnings.catch_warnings():
        # the legacy exporter announces its deprecation on every call; the choice is deliberate (see above)
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        warnings.filterwarnings("ignore", category=torch.jit.TracerWarning)
        if exporter == "torchscript":
            torch.onnx.export(module, args, buffer, input_names=list(input_names), output_names=list(output_names),
                              dynamic_axes={k: dict(v) for k, v in dynamic_axes.items()}, opset_version=opset,
                              do_constant_folding=True, dynamo=False)
            data = buffer.getvalue()
        else:
            data = _export_dynamo(module, args, input_names, output_names, dynamic_axes, opset)
    model = onnx.load_from_string(data)
    props = {META_EXPORTER: exporter, META_VERSION: __version__, **(metadata or {})}
    for key, value in props.items():
        entry = model.metadata_props.add()
        entry.key, entry.value = key, str(value)
    return model.SerializeToString()


def _export_dynamo(module: nn.Module, args: tuple[torch.Tensor, ...], input_names: Sequence[str],
                   output_names: Sequence[str], dynamic_axes: Mapping[str, Mapping[int, str]], opset: int) -> bytes:
    try:
        import onnxscript  # noqa: F401  (the dynamo exporter's graph builder)
    except ImportError:
        raise OnnxUnavailableError("the dynamo ONNX exporter needs the onnxscript package, which is not installed; "
                                   "pip install onnxscript, or use exporter='torchscript' "
                                   f"({CPU_EXTRA_HINT} covers that one)") from None
    # torch.export wants shapes per positional argument; AUTO lets it derive relations such as total = past + new
    auto = torch.export.Dim.AUTO
    shapes: tuple = tuple({axis: auto for axis in dynamic_axes.get(name, {})} or None
                          for name in input_names[:len(args)])
    params = list(inspect.signature(module.forward).parameters.values())
    varargs = [i for i, p in enumerate(params) if p.kind is inspect.Parameter.VAR_POSITIONAL]
    if varargs:  # torch.export sees *args as one tuple argument
        shapes = (*shapes[:varargs[0]], shapes[varargs[0]:])
    # the dynamo exporter builds opset 18 graphs; converting them down fails on Reduce* axes inputs
    program = torch.onnx.export(module, args, input_names=list(input_names), output_names=list(output_names),
                                dynamic_shapes=shapes, opset_version=max(opset, DYNAMO_MIN_OPSET), dynamo=True,
                                verbose=False)
    buffer = io.BytesIO()
    program.save(buffer)
    return buffer.getvalue()


def read_metadata(source: str | Path | bytes) -> dict[str, str]:
    """``metadata_props`` of an ONNX model file or its bytes (the weights are not parsed into tensors)."""
    onnx = import_onnx()
    try:
        if isinstance(source, (bytes, bytearray)):
            model = onnx.load_from_string(bytes(source))
        else:
            model = onnx.load(str(source), load_external_data=False)
    except Exception as exc:
        raise HyspecError(f"cannot read ONNX model {source if not isinstance(source, bytes) else '(bytes)'}: "
                          f"{exc}") from None
    return {p.key: p.value for p in model.metadata_props}


def files_fingerprint(files: Iterable[Path]) -> str:
    """SHA-256 over the files' names and contents: changes whenever any of them does."""
    digest = hashlib.sha256()
    for file in sorted(Path(f) for f in files):
        digest.update(file.name.encode() + b"\0")
        with open(file, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                digest.update(chunk)
        digest.update(b"\0")
    return digest.hexdigest()


def write_atomically(data: bytes, path: Path) -> Path:
    """Write ``data`` to ``path`` through a temporary file in the same folder (readers never see half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


__all__ = ["DEFAULT_OPSET", "EXPORTERS", "META_EXPORTER", "META_VERSION", "export_onnx", "files_fingerprint",
           "read_metadata", "write_atomically"]
