"""``mtp``: chains drafted by DeepSeek-style MTP modules over the target's hidden states.

Drafting k tokens after a sequence ``t[0..n]`` (``t[n]`` is the root, the
last committed token, whose hidden state the target has not computed yet):

* step d = 1..M (M trained modules): module ``d-1`` at position ``n-1``
  consumes its input hidden state there and token ``t[n+d-1]`` (the root,
  then the drafts) and drafts ``t[n+d]`` -- DeepSeek-V3's sequential MTP,
  each depth keeping its own causal chain (its own KV);
* step d > M: the last module is reused one position further on, consuming
  the previous step's output hidden state and draft (vLLM's chaining when
  ``num_nextn_predict_layers`` is 1).

Module ``m`` keeps KV entries for positions ``j`` whose inputs are committed
facts (``j <= n-2-m``: the target hidden state, or module ``m-1``'s output
there, and a committed token); the entries built from drafts are rolled back
after every draft and rebuilt next time from the buffered committed rows, so
catch-up is lazy and any number of idle steps costs nothing but a longer feed.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from hyspec.drafters.dflash.cache import DraftStates, HiddenBuffer, shifted_inputs
from hyspec.drafters.mtp.checkpoint import load_mtp
from hyspec.drafters.mtp.model import MTPDrafter
from hyspec.errors import ConfigError
from hyspec.kv.pool import OutOfKVBlocks
from hyspec.kv.sequence_kv import SequenceKV
from hyspec.ops.sampling import SamplingTensors
from hyspec.seam.forward import NO_LOGITS, Feed
from hyspec.seam.proposer import CommittedHidden, DraftRequest, Proposer
from hyspec.seam.target import TargetContext
from hyspec.seam.tree import DraftTree
from hyspec.seam.views import SequenceView

if TYPE_CHECKING:
    from hyspec.drafters.methods import MethodSpec

log = logging.getLogger(__name__)


class _MTPState:
    """One sequence: per module a KV cache and the committed input rows it has not absorbed."""

    __slots__ = ("kv", "offset", "inputs")

    def __init__(self, kv: list[SequenceKV], offset: int):
        self.kv = kv
        self.offset = offset  # position of KV index 0 (> 0 after a restart)
        # inputs[m] holds H_m rows from position offset + kv[m].num_tokens on; inputs[m].end == inputs[m-1].start.
        self.inputs = [HiddenBuffer(offset) for _ in kv]

    def release(self) -> int:
        freed = sum(len(kv.pages) for kv in self.kv)
        for kv in self.kv:
            kv.release()
        return freed

    def settle(self) -> None:
        """Drop draft-built entries and unused reservations: keep the committed prefix of every module."""
        for kv, buf in zip(self.kv, self.inputs):
            kv.truncate(buf.start - self.offset)


class _Live:
    __slots__ = ("index", "req", "st", "n", "k", "drafts", "probs", "spec", "last")

    def __init__(self, index: int, req: DraftRequest, st: _MTPState, n: int, k: int):
        self.index, self.req, self.st, self.n, self.k = index, req, st, n, k
        self.drafts: list[int] = []
        self.probs: list[torch.Tensor] = []
        self.spec: torch.Tensor | None = None  # previous module's outputs at draft-built positions
        self.last: torch.Tensor | None = None  # [H] output row the next reuse step consumes

    def token(self, pos: int) -> int:
        ids = self.req.seq.token_ids
        return ids[pos] if pos <= self.n else self.drafts[pos - self.n - 1]


class MTPProposer(Proposer):
    method = "mtp"
    needs_hidden = True
    aux_layers = ()  # conditions on CommittedHidden.final (after the final norm), as vLLM's DeepSeekMTP

    def __init__(self, target: TargetContext, drafter: MTPDrafter, max_tokens: int):
        self.drafter = drafter
        self.vocab_size = target.vocab_size
        self.device = target.device
        self.pool = target.pool
        block = drafter.config.block
        self.layouts = [self.pool.register(f"mtp.{m}", 1, block.num_key_value_heads, block.head_dim, target.dtype)
                        for m in range(drafter.num_modules)]
        self.max_tokens = max_tokens
        self.states: DraftStates[_MTPState] = DraftStates(_MTPState.release)
        self.pool.add_reclaimer(self.states.reclaim)

    @classmethod
    def from_spec(cls, target: TargetContext, spec: "MethodSpec", weights: Path) -> "MTPProposer":
        """The proposer for ``spec`` with the modules in ``weights`` (the ``mtp`` factory)."""
        if spec.speculative_token_tree is not None:
            raise ConfigError("speculative_token_tree", "hyspec's mtp drafts chains; static token trees are "
                                                        "not implemented for it (remove the key)")
        model = target.require_model(cls.method)
        drafter = load_mtp(Path(weights), model.config, model.embed_tokens.weight, model.lm_head_weight, target.dtype,
                           target.device, ops=target.ops, max_positions=target.max_model_len + 64)
        return cls(target, drafter, spec.num_speculative_tokens)

    def max_budget(self) -> int:
        return self.max_tokens

    # -- committed hidden states ----------------------------------------------------------------

    def on_commit(self, seq: SequenceView, hidden: CommittedHidden | None) -> None:
        if hidden is None or hidden.final.shape[0] == 0:
            return
        st = self.states.get(seq.request_id)
        if st is None or st.inputs[0].end != hidden.start:
            if st is not None:
                log.debug("mtp: hidden rows of %s resume at %d, expected %d: restarting its draft state",
                          seq.request_id, hidden.start, st.inputs[0].end)
            st = _MTPState([SequenceKV(self.pool, layout) for layout in self.layouts], hidden.start)
            self.states.put(seq.request_id, st)
        st.inputs[0].append(hidden.final)

    def on_finish(self, seq: SequenceView) -> None:
        self.states.drop(seq.request_id)

    # -- drafting -------------------------------------------------------------------------------

    @torch.inference_mode()
    def propose(self, requests: list[DraftRequest], sampling: SamplingTensors) -> list[DraftTree | None]:
        live: list[_Live] = []
        for i, req in enumerate(requests):
            st = self.states.get(req.seq.request_id)
            n = len(req.seq.token_ids) - 1
            if st is None or st.inputs[0].end != n:
                continue  # the target has not handed over the hidden states up to the root yet
            k = min(req.budget, self.max_tokens)
            if self._reserve(st, n, k):
                self.states.touch(req.seq.request_id)
                live.append(_Live(i, req, st, n, k))
        try:
            self._draft(live, sampling)
        finally:
            for lv in live:
                lv.st.settle()
        out: list[DraftTree | None] = [None] * len(requests)
        for lv in live:
            q = torch.stack(lv.probs) if lv.probs else None
            out[lv.index] = DraftTree.chain(lv.req.seq.last_token, lv.drafts, draft_probs=q, vocab_size=self.vocab_size)
        return out

    def _reserve(self, st: _MTPState, n: int, k: int) -> bool:
        M = self.drafter.num_modules
        try:
            for m in range(min(M, k)):
                extra = max(0, k - M) if m == M - 1 else 0
                st.kv[m].reserve(n - st.offset + extra, reclaim=False)
        except OutOfKVBlocks:
            st.settle()
            return False  # no room for this draft this step: the sequence decodes plainly
        return True

    def _draft(self, live: list[_Live], sampling: SamplingTensors) -> None:
        M = self.drafter.num_modules
        depth = max((lv.k for lv in live), default=0)
        for d in range(1, depth + 1):
            group = [lv for lv in live if lv.k >= d]
            if d <= M:
                out, last_rows = self._module_step(d - 1, group)
            else:
                out, last_rows = self._reuse_step(d, group)
            logits = self.drafter.logits(min(d, M) - 1, out[last_rows])
            for lv, row in zip(group, out[last_rows]):
                lv.last = row
            self._choose(group, logits, sampling)

    def _module_step(self, m: int, group: list[_Live]) -> tuple[torch.Tensor, torch.Tensor]:
        """Module ``m`` over positions ``[inputs[m].start, n-1]`` of every sequence in ``group``."""
        feeds, offsets, rows = [], [], []
        for lv in group:
            st, buf = lv.st, lv.st.inputs[m]
            x = buf.rows() if len(buf) else None
            if m > 0 and lv.spec is not None and lv.spec.shape[0]:
                x = lv.spec if x is None else torch.cat([x, lv.spec])
            positions = range(buf.start, lv.n)
            if x is None or x.shape[0] != len(positions):
                raise RuntimeError(f"mtp module {m}: {0 if x is None else x.shape[0]} input rows for "
                                   f"{len(positions)} positions of {lv.req.seq.request_id}")
            rows.append(x)
            feeds.append(Feed(st.kv[m], [lv.token(j + m + 1) for j in positions], buf.start - st.offset,
                              logits=NO_LOGITS))
            offsets.append(st.offset)
        out = self._forward(m, feeds, offsets, torch.cat(rows))
        last = []
        first = 0
        for lv, feed in zip(group, feeds):
            count = len(feed.tokens)
            st, buf = lv.st, lv.st.inputs[m]
            committed = max(lv.n - 1 - m, buf.start)  # entries j <= n-2-m are built from committed inputs only
            r = committed - buf.start
            mine = out[first:first + count]
            buf.drop(r)
            if m + 1 < len(st.inputs):
                st.inputs[m + 1].append(mine[:r])
            lv.spec = mine[r:]
            last.append(first + count - 1)
            first += count
        return out, torch.tensor(last, device=out.device)

    def _reuse_step(self, d: int, group: list[_Live]) -> tuple[torch.Tensor, torch.Tensor]:
        """The last module once more, one position further: its previous output and draft in."""
        m = self.drafter.num_modules - 1
        feeds, offsets = [], []
        for lv in group:
            pos = lv.n - 1 + (d - m - 1)
            feeds.append(Feed(lv.st.kv[m], [lv.drafts[-1]], pos - lv.st.offset, logits=NO_LOGITS))
            offsets.append(lv.st.offset)
        out = self._forward(m, feeds, offsets, torch.stack([lv.last for lv in group]))
        return out, torch.arange(len(group), device=out.device)

    def _forward(self, m: int, feeds: list[Feed], offsets: list[int], hidden: torch.Tensor) -> torch.Tensor:
        inputs = shifted_inputs(feeds, offsets, self.device)
        out = self.drafter.forward_paged(m, inputs.input_ids, hidden, inputs.positions,
                                         self.layouts[m].caches[0], inputs.meta)
        for f in feeds:
            f.kv.num_tokens = f.start + len(f.tokens)
        return out

    def _choose(self, group: list[_Live], logits: torch.Tensor, sampling: SamplingTensors) -> None:
        """Greedy requests take the argmax; the others draw from q = the processed logits, recording q."""
        drafted = logits.argmax(-1).tolist()
        rows = [r for r, lv in enumerate(group) if not lv.req.greedy]
        if rows:
            q = sampling.select([group[r].index for r in rows]).process(logits[rows])
            drawn = self.drafter.ops.sample(q, [group[r].req.seq.generator for r in rows]).tolist()
            for r, tok, q_row in zip(rows, drawn, q):
                drafted[r] = tok
                group[r].probs.append(q_row)
        for lv, tok in zip(group, drafted):
            lv.drafts.append(tok)
