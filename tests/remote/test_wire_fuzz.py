"""Whatever bytes a worker (or anyone on the link) sends, decoding fails only with the protocol's own errors.

``wire.unpack`` promises WireError for anything malformed; ``decode_reply`` and ``draft_to_tree`` add
ProtocolError for well-formed bytes with unusable content.  Any other exception would escape the remote
proposer's per-worker handling and cost every worker's drafts of the step.  Hypothesis drives random
bytes, headers mutated from valid replies, huge and non-integer shapes, deep nesting and odd counts.
"""
from __future__ import annotations

import json
import struct

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hyspec.remote.protocol import (DraftReply, ProtocolError, SeqDraft, decode_call, decode_reply, draft_to_tree,
                                    encode_reply)
from hyspec.remote.wire import MAGIC, WireError, pack, unpack

VOCAB = 32
FUZZ = settings(max_examples=300, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])


def message(header: object, body: bytes = b"") -> bytes:
    """A message with an arbitrary (JSON-able) header, bypassing pack's own checks."""
    head = json.dumps(header).encode()
    return MAGIC + struct.pack("<I", len(head)) + head + body


def valid_reply() -> bytes:
    q = torch.softmax(torch.randn(2, VOCAB, generator=torch.Generator().manual_seed(0)), -1)
    return encode_reply(DraftReply(3, "inc", [SeqDraft("a", "ok", 5, [1, 2], None, q),
                                              SeqDraft("b", "ok", 5, [4, 5, 6], [0, 1, 1], None),
                                              SeqDraft("c", "resync", 2)]))


def decode_everything(data: bytes) -> None:
    """Every step the target applies to a reply; only the protocol's errors may come out."""
    try:
        _, raws = decode_reply(data)
    except (WireError, ProtocolError):
        return
    for raw in raws.values():
        for greedy, trust_q in ((False, False), (False, True), (True, False)):
            try:
                draft_to_tree(raw, 0, raw.hist_len, 4, greedy, VOCAB, trust_q)
            except ProtocolError:
                pass


def test_valid_reply_round_trips():
    _, raws = decode_reply(valid_reply())
    trusted = draft_to_tree(raws["a"], 0, 5, 4, False, VOCAB, trust_q=True)
    assert trusted.tokens.tolist() == [0, 1, 2] and trusted.draft_probs.shape == (3, VOCAB)
    point = draft_to_tree(raws["a"], 0, 5, 4, False, VOCAB)  # by default the worker's q is not used
    assert point.tokens.tolist() == [0, 1, 2] and point.draft_probs is None
    tree = draft_to_tree(raws["b"], 0, 5, 4, False, VOCAB)
    assert tree.parents.tolist() == [-1, 0, 1, 1]


@FUZZ
@given(st.binary(max_size=256))
def test_random_bytes(data):
    for blob in (data, MAGIC + data):
        with pytest.raises(WireError):
            unpack(blob)
        decode_everything(blob)


@FUZZ
@given(st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), min_size=1, max_size=8))
def test_mutated_valid_replies(flips):
    data = bytearray(valid_reply())
    for pos, value in flips:
        data[pos % len(data)] = value
    try:
        unpack(bytes(data))
    except WireError:
        pass
    decode_everything(bytes(data))


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=4),
                    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=6), kids, max_size=3),
                    max_leaves=12)
DIMS = st.lists(st.integers(-2, 2**70) | st.floats() | st.booleans() | st.text(max_size=2) | st.none(), max_size=4)


@FUZZ
@given(st.sampled_from(["int32", "int64", "float32", "uint16", "bool", 7, None]), DIMS, st.binary(max_size=64))
def test_array_specs(dtype, dims, body):
    try:
        _, arrays = unpack(message({"arrays": [[dtype, dims]]}, body))
    except WireError:
        return
    assert len(arrays) == 1 and arrays[0].nbytes == len(body)


@FUZZ
@given(st.dictionaries(st.sampled_from(["rid", "status", "hist_len", "tokens", "parents", "q", "q_vocab",
                                        "q_arrays", "pipelined"]), JSON, max_size=9),
       st.dictionaries(st.sampled_from(["call_id", "incarnation", "drafts", "worker_seconds", "spec_hits",
                                        "spec_misses"]), JSON, max_size=6))
def test_reply_fields_of_any_type(draft, envelope):
    base = {"call_id": 1, "incarnation": "x", "worker_seconds": 0.0, "spec_hits": 0, "spec_misses": 0,
            "drafts": [{"rid": "a", "status": "ok", "hist_len": 0, "tokens": 0, "q": "dense", "q_arrays": [1],
                        **draft}], **envelope}
    tokens = np.array([1, 2], dtype=np.int32)
    q = np.full((2, VOCAB), 1 / VOCAB, dtype=np.float32)
    try:
        data = pack(base, [tokens, q])
    except (TypeError, ValueError):  # not JSON-serialisable (nan, ...): send it unchecked
        data = message({**base, "arrays": [["int32", [2]], ["float32", [2, VOCAB]]]}, tokens.tobytes() + q.tobytes())
    decode_everything(data)


@pytest.mark.parametrize("header", [
    {"arrays": [["int32", [2**64]]]},  # overflows int64
    {"arrays": [["int32", [2**40, 2**40]]]},  # a product past int64
    {"arrays": [["int32", [0, 2**70]]]},  # an empty array with an absurd dimension
    {"arrays": [["int32", [1.5]]]},
    {"arrays": [["int32", [True]]]},
    {"arrays": [["int32", [-1]]]},
    {"arrays": [["int32", "12"]]},
    {"arrays": [[["int32"], [1]]]},  # an unhashable dtype name
    {"arrays": [], "x": "\ud800"},  # a lone surrogate survives json but not everything downstream
])
def test_bad_array_specs(header):
    with pytest.raises(WireError):
        unpack(message(header, b"\0" * 8))


@pytest.mark.parametrize("text", [b"[" * 100_000 + b"]" * 100_000, b'{"a":' * 50_000 + b"1" + b"}" * 50_000,
                                  b'{"arrays": [], "n": ' + b"9" * 10_000 + b"}", b'{"arrays": [], "n": NaN}',
                                  b'{"arrays": [], "n": 1e999}', b"\xff\xfe{}"])
def test_hostile_headers(text):
    data = MAGIC + struct.pack("<I", len(text)) + text
    with pytest.raises(WireError):
        unpack(data)
    decode_everything(data)


@pytest.mark.parametrize("envelope", [{"call_id": 1e300}, {"call_id": float("inf")}, {"spec_hits": -1},
                                      {"worker_seconds": "x"}, {"drafts": "abc"}, {"drafts": [1]},
                                      {"drafts": [{"rid": "a", "status": "ok", "hist_len": 0, "tokens": -1}]},
                                      {"drafts": [{"rid": "a", "status": "ok", "hist_len": 0, "tokens": True}]},
                                      {"drafts": [{"rid": "a", "status": ["ok"], "hist_len": 0, "tokens": 0}]},
                                      {"drafts": [{"rid": "a", "status": "ok", "hist_len": 2.0**80, "tokens": 0}]}])
def test_bad_envelopes_are_wire_errors(envelope):
    base = {"call_id": 1, "incarnation": "x", "worker_seconds": 0.0, "spec_hits": 0, "spec_misses": 0,
            "drafts": [], **envelope}
    data = message({**base, "arrays": [["int32", [1]]]}, b"\0" * 4)
    with pytest.raises((WireError, ProtocolError)):
        decode_reply(data)


@pytest.mark.parametrize("entry", [
    {"parents": 3}, {"parents": [0, "x"]}, {"parents": [[0], 0]},
    {"q": "dense", "q_arrays": [0, 0]},  # two arrays where dense q has one
    {"q": "sparse", "q_vocab": VOCAB, "q_arrays": [0]},  # one where sparse q has three
    {"q": "sparse", "q_vocab": VOCAB, "q_arrays": [1, 1, 1]},  # float counts and indices
    {"q": "dense", "q_arrays": [0]},  # int32 rows as q
    {"q": "sparse", "q_vocab": [VOCAB], "q_arrays": [0, 0, 1]},
])
def test_bad_draft_entries_are_protocol_errors(entry):
    head = {"call_id": 1, "incarnation": "x", "worker_seconds": 0.0, "spec_hits": 0, "spec_misses": 0,
            "drafts": [{"rid": "a", "status": "ok", "hist_len": 5, "tokens": 0, **entry}]}
    data = pack(head, [np.array([1, 2], dtype=np.int32), np.full((2, VOCAB), 1 / VOCAB, dtype=np.float32)])
    with pytest.raises((WireError, ProtocolError)):
        _, raws = decode_reply(data)
        draft_to_tree(raws["a"], 0, 5, 4, False, VOCAB)


@FUZZ
@given(st.binary(max_size=200))
def test_worker_side_decode_call(data):
    for blob in (data, message({"call_id": 1, "updates": [{"rid": "a", "n": 2**70}]}, data)):
        with pytest.raises(WireError):
            decode_call(blob)
