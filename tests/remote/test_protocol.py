"""The remote-drafting wire format and the checks on everything a worker returns."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from hyspec.remote.protocol import (DraftCall, DraftReply, HiddenBlock, ProtocolError, SamplingSpec, SeqDraft,
                                    SeqUpdate, decode_call, decode_reply, draft_to_tree, encode_call, encode_reply,
                                    pack_q, unpack_q)
from hyspec.remote.wire import WireError, pack, unpack

V = 50


def _q(rows: int, support: int | None = None, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, V, generator=g)
    if support is not None:  # like top-k: only `support` tokens keep mass
        cut = logits.topk(support, dim=1).values[:, -1:]
        logits = logits.masked_fill(logits < cut, float("-inf"))
    return torch.softmax(logits, dim=1)


def _reply_bytes(draft: SeqDraft) -> bytes:
    return encode_reply(DraftReply(7, "inc", [draft]))


def _raw(draft: SeqDraft):
    return decode_reply(_reply_bytes(draft))[1][draft.rid]


# -- wire -----------------------------------------------------------------------------------------

def test_wire_roundtrip_and_exact_size():
    arrays = [np.arange(5, dtype=np.int32), np.ones((2, 3), dtype=np.float32), np.zeros(0, dtype=np.int64)]
    data = pack({"a": 1, "b": [1, "x"]}, arrays)
    head, back = unpack(data)
    assert head == {"a": 1, "b": [1, "x"]}
    for a, b in zip(arrays, back):
        assert a.dtype == b.dtype and np.array_equal(a, b)


@pytest.mark.parametrize("mutate", [
    lambda d: d[:3],  # truncated magic
    lambda d: b"XXXX" + d[4:],  # wrong magic
    lambda d: d[:-2],  # an array cut short
    lambda d: d + b"\0",  # trailing bytes
    lambda d: d[:4] + (10 ** 6).to_bytes(4, "little") + d[8:],  # header length past the end
    lambda d: d.replace(b'"int32"', b'"object"'),  # a dtype that may not travel
    lambda d: d.replace(b'"arrays"', b'"arrayz"'),  # no array list
    lambda d: 12345,  # not bytes at all
])
def test_wire_rejects_malformed(mutate):
    data = pack({"k": 1}, [np.arange(4, dtype=np.int32)])
    with pytest.raises(WireError):
        unpack(mutate(data))


def test_pack_refuses_untransportable_dtype():
    with pytest.raises(ValueError, match="cannot travel"):
        pack({}, [np.zeros(2, dtype=np.complex64)])


# -- calls ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_call_roundtrip_with_hidden_states(dtype):
    h = HiddenBlock(3, torch.randn(2, 8).to(dtype), {1: torch.randn(2, 8).to(dtype)})
    call = DraftCall(5, [SeqUpdate("a", 0, [1, 2, 3, 4], 3, SamplingSpec(0.7, 20, 0.9, 0.0), 11, [h]),
                         SeqUpdate("b", 9, [5], 0)], releases=["z"], pipelining=True, threads=4)
    back = decode_call(encode_call(call))
    assert (back.call_id, back.releases, back.pipelining, back.threads) == (5, ["z"], True, 4)
    a, b = back.updates
    assert (a.rid, a.start, a.tokens, a.budget, a.sampling, a.seed) == ("a", 0, [1, 2, 3, 4], 3,
                                                                         SamplingSpec(0.7, 20, 0.9, 0.0), 11)
    assert (b.rid, b.start, b.tokens, b.budget, b.sampling, b.hidden) == ("b", 9, [5], 0, None, [])
    (hb,) = a.hidden
    assert hb.start == 3 and hb.final.dtype == dtype and torch.equal(hb.final, h.final)
    assert torch.equal(hb.aux[1], h.aux[1])


def test_update_rejects_negative_fields():
    with pytest.raises(ValueError):
        SeqUpdate("a", -1, [1], 1)


# -- q rows ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("support", [None, 5])
def test_q_roundtrip_is_exact(support):
    """The target must verify with exactly the q the worker drew from (lossless), so no rounding."""
    q = _q(3, support)
    head, arrays = pack_q(q)
    assert head["q"] == ("dense" if support is None else "sparse")
    assert torch.equal(unpack_q(head, arrays, 3, V), q)


def test_sparse_q_is_smaller_than_dense():
    q = _q(4, support=5)
    sparse = sum(a.nbytes for a in pack_q(q)[1])
    assert sparse < q.numel() * 4 / 4


# -- draft_to_tree --------------------------------------------------------------------------------

def test_valid_chain_and_tree_pass():
    q = _q(3)
    toks = q.argmax(1).tolist()
    tree = draft_to_tree(_raw(SeqDraft("r", "ok", 10, toks, None, q)), root=4, hist_len=10, budget=3,
                         greedy=False, vocab=V, trust_q=True)
    assert tree.tokens.tolist() == [4, *toks] and tree.parents.tolist() == [-1, 0, 1, 2]
    assert torch.equal(tree.draft_probs[1:], q)
    point = draft_to_tree(_raw(SeqDraft("r", "ok", 10, toks, None, q)), 4, 10, 3, False, V)  # the default
    assert point.tokens.tolist() == [4, *toks] and point.draft_probs is None
    tree = draft_to_tree(_raw(SeqDraft("r", "ok", 10, [5, 6, 7], [0, 0, 1])), 4, 10, 3, True, V)
    assert tree.parents.tolist() == [-1, 0, 0, 1] and tree.draft_probs is None


def test_greedy_ignores_q():
    raw = _raw(SeqDraft("r", "ok", 10, [1, 2], None, torch.full((2, V), float("nan"))))
    assert draft_to_tree(raw, 4, 10, 2, greedy=True, vocab=V).draft_probs is None


@pytest.mark.parametrize("draft,kind", [
    (SeqDraft("r", "ok", 9, [1, 2]), "stale"),  # drafted for another history length
    (SeqDraft("r", "ok", 10, [1, 2, 3, 4]), "length"),  # over budget
    (SeqDraft("r", "ok", 10, []), "length"),  # empty
    (SeqDraft("r", "ok", 10, [1, V + 3]), "vocab"),
    (SeqDraft("r", "ok", 10, [-1, 2]), "vocab"),
    (SeqDraft("r", "ok", 10, [1, 2], [0, 2]), "structure"),  # a parent that is not earlier
    (SeqDraft("r", "ok", 10, [1, 2], [0]), "structure"),
])
def test_bad_drafts_are_named(draft, kind):
    with pytest.raises(ProtocolError) as e:
        draft_to_tree(_raw(draft), 4, 10, 3, True, V)
    assert e.value.kind == kind


@pytest.mark.parametrize("breakage", ["nan", "negative", "sum", "zero_at_draw", "width"])
def test_bad_probabilities_are_caught(breakage):
    q = _q(2)
    toks = q.argmax(1).tolist()
    if breakage == "nan":
        q[1, 3] = float("nan")
    elif breakage == "negative":
        q[0, 0] = -0.1
    elif breakage == "sum":
        q = q * 1.5
    elif breakage == "zero_at_draw":
        q[0, toks[0]] = 0.0
        q[0] /= q[0].sum()
    elif breakage == "width":
        q = torch.cat([q, q[:, :1]], 1)
    with pytest.raises(ProtocolError) as e:
        draft_to_tree(_raw(SeqDraft("r", "ok", 10, toks, None, q)), 4, 10, 2, greedy=False, vocab=V)
    assert e.value.kind == "probs"


def test_reply_rejects_duplicates_and_unknown_status():
    data = encode_reply(DraftReply(1, "i", [SeqDraft("a", "ok", 3, [1]), SeqDraft("a", "ok", 3, [2])]))
    with pytest.raises(ProtocolError, match="two drafts"):
        decode_reply(data)
    data = encode_reply(DraftReply(1, "i", [SeqDraft("a", "weird", 3, [1])]))
    with pytest.raises(ProtocolError, match="status"):
        decode_reply(data)
    with pytest.raises(WireError):
        decode_reply(pack({"call_id": 1}, []))
