"""The byte format of remote-drafting messages: a JSON header plus raw numpy buffers.

    b"HSR1" | u32 header length | header (UTF-8 JSON) | buffer 0 | buffer 1 | ...

The header holds the message's plain fields and, under ``"arrays"``, one
``[dtype, shape]`` entry per buffer, in order.  Nothing here executes code
while decoding (unlike pickle): a worker that returns garbage can at worst
produce a :class:`WireError` -- and nothing else (tests/remote/test_wire_fuzz.py)
-- which the caller counts and survives.  Sizes are exact, so "bytes per step"
is what crossed the wire, not an estimate.
"""
from __future__ import annotations

import json
import math
import struct
from typing import Any

import numpy as np

MAGIC = b"HSR1"
# Dtypes a message may carry: token ids, draft probabilities, hidden states (bf16 travels as its bits).
DTYPES = ("int32", "int64", "float16", "float32", "uint16")
MAX_HEADER_BYTES = 16 << 20
# Bounds that no real message comes near; they keep hostile numbers from reaching numpy.
MAX_DIM = 1 << 40
MAX_NDIM = 8
MAX_INT_DIGITS = 20
_LEN = struct.Struct("<I")


class WireError(ValueError):
    """Bytes that are not a well-formed message (truncated, wrong magic, bad header, bad array spec)."""


def pack(header: dict[str, Any], arrays: list[np.ndarray]) -> bytes:
    """Serialise ``header`` (JSON-able, without an ``arrays`` key) and ``arrays``."""
    if "arrays" in header:
        raise ValueError("the 'arrays' header key is reserved")
    specs = []
    for a in arrays:
        if a.dtype.name not in DTYPES:
            raise ValueError(f"dtype {a.dtype.name} cannot travel; allowed: {', '.join(DTYPES)}")
        specs.append([a.dtype.name, list(a.shape)])
    head = json.dumps({**header, "arrays": specs}, separators=(",", ":"), allow_nan=False).encode()
    parts = [MAGIC, _LEN.pack(len(head)), head]
    parts.extend(np.ascontiguousarray(a).tobytes() for a in arrays)
    return b"".join(parts)


def unpack(data: bytes) -> tuple[dict[str, Any], list[np.ndarray]]:
    """Inverse of :func:`pack`; raises WireError, and nothing else, for any malformed input."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise WireError(f"expected bytes, got {type(data).__name__}")
    data = bytes(data)
    if len(data) < len(MAGIC) + _LEN.size or data[:len(MAGIC)] != MAGIC:
        raise WireError("not a hyspec remote message (bad magic)")
    (n,) = _LEN.unpack_from(data, len(MAGIC))
    start = len(MAGIC) + _LEN.size
    if n > MAX_HEADER_BYTES or start + n > len(data):
        raise WireError(f"header length {n} does not fit the {len(data)}-byte message")
    header = _parse_header(data[start:start + n])
    offset = start + n
    arrays = []
    for spec in header.pop("arrays"):
        dtype, shape = _array_spec(spec)
        size = math.prod(shape) * dtype.itemsize  # Python ints: no overflow, however absurd the dims
        if size > len(data) - offset:
            raise WireError(f"an array of shape {shape} runs past the end of the message")
        arrays.append(np.frombuffer(data, dtype=dtype, count=math.prod(shape), offset=offset).reshape(shape))
        offset += size
    if offset != len(data):
        raise WireError(f"{len(data) - offset} trailing bytes after the last array")
    return header, arrays


def _reject_constant(name: str) -> None:
    raise WireError(f"{name} in the header (pack never writes it)")


def _parse_header(raw: bytes) -> dict[str, Any]:
    try:
        # NaN/Infinity are refused like pack refuses them; number literals JSON allows but Python cannot
        # hold exactly (1e999 -> inf, a 5000-digit int) are refused too: no field of a message needs them.
        header = json.loads(raw, parse_constant=_reject_constant, parse_float=_finite_float, parse_int=_int)
    except WireError:
        raise
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, UnicodeDecodeError, too deep a nesting
        raise WireError(f"unreadable header: {type(exc).__name__}: {str(exc)[:200]}") from None
    if not isinstance(header, dict) or not isinstance(header.get("arrays"), list):
        raise WireError("the header is not an object with an 'arrays' list")
    return header


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise WireError(f"number {text[:40]} is out of range")
    return value


def _int(text: str) -> int:
    if len(text) > MAX_INT_DIGITS:
        raise WireError(f"a {len(text)}-digit integer in the header")
    return int(text)


def _array_spec(spec: Any) -> tuple[np.dtype, tuple[int, ...]]:
    """``[dtype, shape]`` checked: a known dtype name and non-negative integer dims (bools are not dims)."""
    if (not isinstance(spec, list) or len(spec) != 2 or not isinstance(spec[0], str) or spec[0] not in DTYPES
            or not isinstance(spec[1], list) or len(spec[1]) > MAX_NDIM
            or not all(type(d) is int and 0 <= d <= MAX_DIM for d in spec[1])):
        raise WireError(f"bad array spec {str(spec)[:200]}")
    return np.dtype(spec[0]), tuple(spec[1])
