"""Remote-drafting messages: what the target sends a worker each step, and what comes back.

Target -> worker, one :class:`DraftCall` per worker and step:

* per sequence a :class:`SeqUpdate`: the tokens the target committed since
  the worker last heard of the sequence (``start`` = their index in the
  sequence's history, so the update is idempotent and a lost or reordered
  message shows up as a gap, answered with ``resync``), the draft budget
  (0 = "warm up only": process the prompt, draft nothing), sampling
  parameters and a seed at registration, and, for drafters conditioned on
  target hidden states, the hidden states of committed tokens;
* ``releases``: sequences that finished;
* ``pipelining`` and ``threads`` (the adaptive scheduler's thread count).

Worker -> target, one :class:`DraftReply`: per sequence a :class:`SeqDraft`
with the history length it continues (stale drafts are discarded), the
draft tokens, parents for trees, and for sampled requests -- when the call's
``send_q`` asks for them (``remote.trust_worker_q``) -- the q rows of the
drafted nodes only (sparse when the processed q is sparse, as after top-k or
top-p).  :func:`decode_reply` raises only WireError / ProtocolError whatever
the bytes; :func:`draft_to_tree` checks everything a worker returns before it
becomes a :class:`~hyspec.seam.tree.DraftTree`: lengths, ids, structure,
finite probabilities that sum to one and are positive at the drawn tokens.
A q is used only when trusted: nothing here can tell whether a token was
really drawn from the q reported with it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from hyspec.remote.wire import WireError, pack, unpack
from hyspec.seam.tree import DraftTree

STATUSES = ("ok", "none", "resync", "error")
# Processed q rows sum to 1 up to fp32 rounding over the vocabulary; anything further off is not a distribution.
Q_SUM_TOLERANCE = 1e-3


class ProtocolError(ValueError):
    """A worker's answer is unusable; ``kind`` names the problem for the metrics."""

    def __init__(self, kind: str, message: str):
        self.kind = kind
        super().__init__(message)


@dataclass(frozen=True)
class SamplingSpec:
    temperature: float
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @classmethod
    def from_params(cls, params: Any) -> "SamplingSpec":
        return cls(float(params.temperature), int(params.top_k or 0), float(params.top_p), float(params.min_p))


@dataclass
class HiddenBlock:
    """Target hidden states of tokens ``history[start : start + n]`` (see ``CommittedHidden``)."""

    start: int
    final: torch.Tensor  # [n, H]
    aux: dict[int, torch.Tensor] = field(default_factory=dict)  # layer -> [n, H]


@dataclass
class SeqUpdate:
    rid: str
    start: int  # index of tokens[0] in the sequence's history
    tokens: list[int]
    budget: int  # draft nodes wanted; 0 = warm up only
    sampling: SamplingSpec | None = None  # sent when the worker first hears of the sequence
    seed: int | None = None  # seeds the worker's generator for sampled drafts
    hidden: list[HiddenBlock] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.start < 0 or self.budget < 0:
            raise ValueError(f"SeqUpdate {self.rid}: start and budget must be >= 0")


@dataclass
class DraftCall:
    call_id: int
    updates: list[SeqUpdate]
    releases: list[str] = field(default_factory=list)
    pipelining: bool = False
    threads: int | None = None
    send_q: bool = True  # False: the target verifies drafts as point proposals and never reads q


@dataclass
class SeqDraft:
    rid: str
    status: str  # ok | none (nothing worth proposing) | resync (history gap) | error (drafter raised)
    hist_len: int  # length of the history the draft continues
    tokens: list[int] = field(default_factory=list)  # draft nodes, root excluded
    parents: list[int] | None = None  # per draft node, its parent's node index (0 = root); None = chain
    q: torch.Tensor | None = None  # [len(tokens), V] fp32 processed q of each node, or None (deterministic)
    pipelined: bool = False  # served from work done while the target verified


@dataclass
class DraftReply:
    call_id: int
    incarnation: str
    drafts: list[SeqDraft]
    worker_seconds: float = 0.0  # compute time for this call (drafting, not queueing)
    spec_hits: int = 0
    spec_misses: int = 0


# -- tensors on the wire --------------------------------------------------------------------------

def _tensor_to_wire(t: torch.Tensor) -> tuple[str, np.ndarray]:
    t = t.detach().cpu().contiguous()
    if t.dtype == torch.bfloat16:
        return "bfloat16", t.view(torch.int16).numpy().view(np.uint16)
    if t.dtype in (torch.float16, torch.float32):
        return str(t.dtype).removeprefix("torch."), t.numpy()
    return "float32", t.float().numpy()


def _tensor_from_wire(kind: str, a: np.ndarray) -> torch.Tensor:
    if kind == "bfloat16":
        return torch.from_numpy(a.astype(np.uint16).view(np.int16).copy()).view(torch.bfloat16)
    if kind in ("float16", "float32") and a.dtype.name == kind:
        return torch.from_numpy(a.copy())
    raise WireError(f"hidden state of kind {kind!r} carried as {a.dtype.name}")


def pack_q(q: torch.Tensor) -> tuple[dict[str, Any], list[np.ndarray]]:  # q [n, V] fp32
    """Rows of q as dense fp32, or sparse (per-row counts, indices, values) when that is smaller."""
    q = q.detach().float().cpu()
    nz = q != 0
    nnz = int(nz.sum())
    if nnz * 8 < q.numel() * 4:
        idx = nz.nonzero()
        counts = nz.sum(1).to(torch.int32).numpy()
        return ({"q": "sparse", "q_vocab": int(q.shape[1])},
                [counts, idx[:, 1].to(torch.int32).numpy(), q[nz].numpy()])
    return {"q": "dense"}, [q.numpy()]


def unpack_q(head: dict[str, Any], arrays: list[np.ndarray], rows: int, vocab: int) -> torch.Tensor:
    """Inverse of :func:`pack_q` onto ``[rows, vocab]``; raises ProtocolError for inconsistent data."""
    if head.get("q") == "dense":
        if len(arrays) != 1 or arrays[0].dtype != np.float32 or arrays[0].shape != (rows, vocab):
            raise ProtocolError("probs", f"dense q is not one float32 array of shape {(rows, vocab)}")
        return torch.from_numpy(arrays[0].copy())
    if head.get("q") != "sparse" or len(arrays) != 3:
        raise ProtocolError("probs", f"q packed as {str(head.get('q'))[:40]!r} in {len(arrays)} arrays")
    counts, idx, val = arrays
    if type(head.get("q_vocab")) is not int or head["q_vocab"] != vocab:
        raise ProtocolError("probs", f"q over {str(head.get('q_vocab'))[:40]} tokens, the target has {vocab}")
    if (counts.dtype != np.int32 or idx.dtype != np.int32 or val.dtype != np.float32 or counts.shape != (rows,)
            or idx.ndim != 1 or idx.shape != val.shape or (counts < 0).any()
            or int(counts.sum(dtype=np.int64)) != idx.shape[0]):
        raise ProtocolError("probs", "sparse q counts do not match its entries")
    if idx.size and (idx.min() < 0 or idx.max() >= vocab):
        raise ProtocolError("vocab", "sparse q names a token outside the vocabulary")
    row = np.repeat(np.arange(rows), counts)
    flat = row.astype(np.int64) * vocab + idx
    if np.unique(flat).size != flat.size:
        raise ProtocolError("probs", "sparse q repeats an entry")
    q = torch.zeros(rows * vocab, dtype=torch.float32)
    q[torch.from_numpy(flat)] = torch.from_numpy(val.copy())
    return q.view(rows, vocab)


# -- calls ----------------------------------------------------------------------------------------

def encode_call(call: DraftCall) -> bytes:
    updates, arrays = [], []
    tokens = [t for u in call.updates for t in u.tokens]
    arrays.append(np.asarray(tokens, dtype=np.int32))
    for u in call.updates:
        entry: dict[str, Any] = {"rid": u.rid, "start": u.start, "n": len(u.tokens), "budget": u.budget}
        if u.sampling is not None:
            s = u.sampling
            entry["sampling"] = [s.temperature, s.top_k, s.top_p, s.min_p]
        if u.seed is not None:
            entry["seed"] = u.seed
        if u.hidden:
            blocks = []
            for h in u.hidden:
                kind, final = _tensor_to_wire(h.final)
                block = {"start": h.start, "kind": kind, "final": len(arrays), "aux": {}}
                arrays.append(final)
                for layer, t in sorted(h.aux.items()):
                    block["aux"][str(layer)] = len(arrays)
                    arrays.append(_tensor_to_wire(t)[1])
                blocks.append(block)
            entry["hidden"] = blocks
        updates.append(entry)
    head = {"call_id": call.call_id, "updates": updates, "releases": list(call.releases),
            "pipelining": bool(call.pipelining), "threads": call.threads, "send_q": bool(call.send_q)}
    return pack(head, arrays)


def decode_call(data: bytes) -> DraftCall:
    head, arrays = unpack(data)
    try:
        tokens = arrays[0].astype(np.int64).tolist()
        updates, pos = [], 0
        for e in head["updates"]:
            n = int(e["n"])
            sampling = SamplingSpec(*e["sampling"]) if "sampling" in e else None
            hidden = []
            for b in e.get("hidden", []):
                aux = {int(layer): _tensor_from_wire(b["kind"], arrays[i]) for layer, i in b["aux"].items()}
                hidden.append(HiddenBlock(int(b["start"]), _tensor_from_wire(b["kind"], arrays[b["final"]]), aux))
            updates.append(SeqUpdate(str(e["rid"]), int(e["start"]), tokens[pos:pos + n], int(e["budget"]),
                                     sampling, e.get("seed"), hidden))
            pos += n
        if pos != len(tokens):
            raise WireError("update token counts do not add up")
        return DraftCall(int(head["call_id"]), updates, [str(r) for r in head["releases"]],
                         bool(head["pipelining"]), head.get("threads"), bool(head.get("send_q", True)))
    except (KeyError, TypeError, IndexError, ValueError, AttributeError, RecursionError) as exc:
        raise WireError(f"malformed draft call: {type(exc).__name__}: {str(exc)[:200]}") from None


# -- replies --------------------------------------------------------------------------------------

def encode_reply(reply: DraftReply) -> bytes:
    drafts, arrays = [], []
    for d in reply.drafts:
        entry: dict[str, Any] = {"rid": d.rid, "status": d.status, "hist_len": d.hist_len,
                                 "tokens": len(arrays), "pipelined": d.pipelined}
        arrays.append(np.asarray(d.tokens, dtype=np.int32))
        if d.parents is not None:
            entry["parents"] = list(d.parents)
        if d.q is not None:
            qhead, qarrays = pack_q(d.q)
            entry.update(qhead)
            entry["q_arrays"] = list(range(len(arrays), len(arrays) + len(qarrays)))
            arrays.extend(qarrays)
        drafts.append(entry)
    head = {"call_id": reply.call_id, "incarnation": reply.incarnation, "drafts": drafts,
            "worker_seconds": reply.worker_seconds, "spec_hits": reply.spec_hits, "spec_misses": reply.spec_misses}
    return pack(head, arrays)


@dataclass
class RawDraft:
    """A reply entry decoded but not yet trusted (q still packed)."""

    rid: str
    status: str
    hist_len: int
    tokens: np.ndarray
    parents: list[int] | None
    q_head: dict[str, Any] | None
    q_arrays: list[np.ndarray]
    pipelined: bool


def decode_reply(data: bytes) -> tuple[DraftReply, dict[str, RawDraft]]:
    """The reply's envelope and its drafts by request id; raises WireError / ProtocolError, nothing else."""
    head, arrays = unpack(data)
    drafts = _field(head, "drafts", list)
    raws: dict[str, RawDraft] = {}
    for e in drafts:
        if not isinstance(e, dict):
            raise WireError("a draft entry is not an object")
        rid = _field(e, "rid", str)
        if rid in raws:
            raise ProtocolError("structure", f"two drafts for request {rid[:80]}")
        status = _field(e, "status", str)
        if status not in STATUSES:
            raise ProtocolError("structure", f"unknown draft status {status[:40]!r}")
        q_head = None
        if "q" in e:
            q_head = {"q": _field(e, "q", str), "q_vocab": e.get("q_vocab")}
        q_arrays = [_array(arrays, i) for i in _field(e, "q_arrays", list, [])]
        raws[rid] = RawDraft(rid, status, _field(e, "hist_len", int), _array(arrays, _field(e, "tokens", int)),
                             _field(e, "parents", list, None), q_head, q_arrays, _field(e, "pipelined", bool, False))
    reply = DraftReply(_field(head, "call_id", int), _field(head, "incarnation", str), [],
                       _field(head, "worker_seconds", float), _field(head, "spec_hits", int),
                       _field(head, "spec_misses", int))
    return reply, raws


_REQUIRED = object()


def _field(entry: dict[str, Any], key: str, kind: type, default: Any = _REQUIRED) -> Any:
    """``entry[key]`` if it is a ``kind`` (ints and floats non-negative, bools not ints), else WireError."""
    if key not in entry:
        if default is _REQUIRED:
            raise WireError(f"malformed draft reply: no {key!r}")
        return default
    value = entry[key]
    if value is None and default is None:
        return None
    if kind is float:
        ok = type(value) in (int, float) and value >= 0  # the header's floats are finite (wire.unpack)
    else:
        ok = type(value) is kind and (kind is not int or value >= 0)
    if not ok:
        raise WireError(f"malformed draft reply: {key!r} is {str(value)[:40]!r}, expected a {kind.__name__}")
    return value


def _array(arrays: list[np.ndarray], index: Any) -> np.ndarray:
    if type(index) is not int or not 0 <= index < len(arrays):
        raise WireError(f"malformed draft reply: array index {str(index)[:40]!r} of {len(arrays)}")
    return arrays[index]


def draft_to_tree(raw: RawDraft, root: int, hist_len: int, budget: int, greedy: bool, vocab: int,
                  trust_q: bool = False) -> DraftTree:
    """A checked DraftTree from a worker's draft, or ProtocolError naming what is wrong.

    The tree carries the worker's q only with ``trust_q``.  Otherwise it has none and the verifier treats
    each draft token as a point proposal (accept x with probability p(x), else draw from p with x removed),
    which is lossless however the token was chosen: a worker that misreports q -- buggy, hostile, or
    tampered with on the link -- cannot bias the output, it can only lower the acceptance.  A q that is
    sent anyway is still checked, so a garbled one is counted like any other garbage.
    """
    if raw.hist_len != hist_len:
        raise ProtocolError("stale", f"draft continues {raw.hist_len} tokens, the sequence has {hist_len}")
    tokens = raw.tokens
    n = int(tokens.shape[0]) if tokens.ndim == 1 else -1
    if not 1 <= n <= budget:
        raise ProtocolError("length", f"{n} draft tokens for a budget of {budget}")
    if tokens.dtype != np.int32 or int(tokens.min()) < 0 or int(tokens.max()) >= vocab:
        raise ProtocolError("vocab", "a draft token is outside the vocabulary")
    if raw.parents is None:
        parents = list(range(-1, n))
    else:
        if (len(raw.parents) != n or not all(type(p) is int for p in raw.parents)
                or any(not 0 <= p <= i for i, p in enumerate(raw.parents))):
            raise ProtocolError("structure", "tree parents are not topologically ordered node indices")
        parents = [-1, *raw.parents]
    q = None
    if raw.q_head is not None and not greedy:  # greedy verification never reads q
        q = unpack_q(raw.q_head, raw.q_arrays, n, vocab)
        if not bool(torch.isfinite(q).all()) or bool((q < 0).any()):
            raise ProtocolError("probs", "draft probabilities contain NaN, inf or negatives")
        if bool(((q.sum(1) - 1).abs() > Q_SUM_TOLERANCE).any()):
            raise ProtocolError("probs", "a draft probability row does not sum to 1")
        if bool((q.gather(1, torch.from_numpy(tokens.astype(np.int64))[:, None]) <= 0).any()):
            raise ProtocolError("probs", "a draft token has zero draft probability")
        q = torch.cat([q.new_zeros(1, vocab), q]) if trust_q else None
    ids = torch.tensor([root, *tokens.tolist()], dtype=torch.int64)
    try:
        return DraftTree(ids, torch.tensor(parents, dtype=torch.int64), q, vocab)
    except Exception as exc:  # DraftTree re-checks structure; any complaint is the worker's fault
        raise ProtocolError("structure", str(exc)) from None
