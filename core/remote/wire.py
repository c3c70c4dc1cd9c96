"""The byte format of remote-drafting messages: a JSON header plus raw numpy buffers.

    b"HSR1" | u32 header length | header (UTF-8 JSON) | buffer 0 | buffer 1 | ...

The header holds the message's plain fields and, under ``"arrays"``, one
``[dtype, shape]`` entry per buffer, in order.  Nothing here executes code
while decoding (unlike pickle): a worker that returns garbage can at worst
produce a :class:`WireError`, which the caller counts and survives.  Sizes
are exact, so "bytes per step" is what crossed the wire, not an estimate.
"""
from __future__ import annotations

import json
import struct
from typing import Any

import numpy as np

MAGIC = b"HSR1"
# Dtypes a message may carry: token ids, draft probabilities, hidden states (bf16 travels as its bits).
DTYPES = ("int32", "int64", "float16", "float32", "uint16")
MAX_HEADER_BYTES = 16 << 20
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
    """Inverse of :func:`pack`; raises WireError for anything malformed."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise WireError(f"expected bytes, got {type(data).__name__}")
    data = bytes(data)
    if len(data) < len(MAGIC) + _LEN.size or data[:len(MAGIC)] != MAGIC:
        raise WireError("not a hyspec remote message (bad magic)")
    (n,) = _LEN.unpack_from(data, len(MAGIC))
    start = len(MAGIC) + _LEN.size
    if n > MAX_HEADER_BYTES or start + n > len(data):
        raise WireError(f"header length {n} does not fit the {len(data)}-byte message")
    try:
        header = json.loads(data[start:start + n])
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise WireError(f"unreadable header: {exc}") from None
    if not isinstance(header, dict) or not isinstance(header.get("arrays"), list):
        raise WireError("the header is not an object with an 'arrays' list")
    offset = start + n
    arrays = []
    for spec in header.pop("arrays"):
        if (not isinstance(spec, list) or len(spec) != 2 or spec[0] not in DTYPES
                or not isinstance(spec[1], list) or not all(isinstance(d, int) and d >= 0 for d in spec[1])):
            raise WireError(f"bad array spec {spec!r}")
        dtype = np.dtype(spec[0])
        count = int(np.prod(spec[1], dtype=np.int64)) if spec[1] else 1
        size = count * dtype.itemsize
        if offset + size > len(data):
            raise WireError("an array runs past the end of the message")
        arrays.append(np.frombuffer(data, dtype=dtype, count=count, offset=offset).reshape(spec[1]))
        offset += size
    if offset != len(data):
        raise WireError(f"{len(data) - offset} trailing bytes after the last array")
    return header, arrays
