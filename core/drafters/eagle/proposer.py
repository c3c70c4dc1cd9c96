"""``eagle`` / ``eagle3``: EAGLE-2 dynamic trees drafted by an EAGLE head over the target's features.

Per sequence the head keeps its own KV in the shared pool (layout ``eagle`` /
``eagle3``): entry ``e`` holds pair ``base + e``, i.e. (feature of token
``base + e``, token ``base + e + 1``), at position ``e``.  Features arrive
through :meth:`on_commit` after every step and are buffered; :meth:`propose`
catches up lazily -- every pair not yet in the head's KV, ending with the root
pair (feature of the last committed token, the root token), goes through one
paged forward, whose last row gives the root's children (the tree's first
level).  Each further level is one forward for all sequences of the batch:
the frontiers fed so far, tree-masked and at their depth positions, after the
committed pairs.  (The op's tree mask covers only the entries written by the
same forward, so earlier frontiers are re-fed each level -- a few dozen rows
for one layer -- rather than left visible to every branch as context.)

Draft entries never become context: a committed pair needs the target's real
feature, which arrives after verification.  So when the step's features arrive
(and again before drafting) the KV is cut back to the committed pairs
(rollback); everything is freed on finish or preemption.  When the target needs pages, head caches are given up (least
recently drafted first); such a sequence restarts its head context at the
features still buffered, drafting with a shorter context rather than none.
"""
from __future__ import annotations

import logging
from collections import OrderedDict
from pathlib import Path

import torch

from hyspec.drafters.eagle.checkpoint import load_head
from hyspec.drafters.eagle.model import EAGLE, EAGLE3
from hyspec.drafters.eagle.tree import DynamicTrees, draft_logprobs
from hyspec.errors import CheckpointError
from hyspec.kv.pool import OutOfKVBlocks
from hyspec.kv.sequence_kv import SequenceKV
from hyspec.ops.sampling import SamplingTensors
from hyspec.seam.forward import NO_LOGITS, Feed, build_inputs
from hyspec.seam.proposer import CommittedHidden, DraftRequest, Proposer
from hyspec.seam.target import TargetContext
from hyspec.seam.tree import DraftTree
from hyspec.seam.views import SequenceView
from hyspec.drafters.methods import MAX_TREE_BUDGET, MethodSpec

log = logging.getLogger(__name__)


class _HeadState:
    """One sequence's head KV and buffered features.

    The features live in a buffer that grows by doubling: appending a step's rows to a
    ``torch.cat`` of everything buffered copied the whole buffer every step, quadratic in the
    sequence's length, and while the controller keeps the head from drafting every token of the
    request stays buffered (3H floats a token for EAGLE-3) -- at batch 32 that copy was a few
    per cent of the step.  A tensor handed in (``restart``) is not written to: it may be the
    target's hidden states, which other drafters read too."""

    __slots__ = ("kv", "base", "fed", "_buf", "_len", "_owned", "feat_start")

    def __init__(self, kv: SequenceKV, start: int):
        self.kv = kv
        self.base = start  # pair index of KV entry 0
        self.fed = 0  # KV entries 0..fed-1 hold committed pairs (real features)
        self._buf: torch.Tensor | None = None  # rows 0.._len-1: raw features of pairs feat_start ..
        self._len = 0
        self._owned = False  # _buf was allocated here (may be written in place)
        self.feat_start = start

    @property
    def feats(self) -> torch.Tensor | None:
        """[m, F] raw features of pairs feat_start .. feat_start+m-1 (a view of the buffer)."""
        return None if self._buf is None else self._buf[:self._len]

    @feats.setter
    def feats(self, value: torch.Tensor | None) -> None:
        self._buf, self._len, self._owned = value, 0 if value is None else value.shape[0], False

    @property
    def feat_end(self) -> int:
        return self.feat_start + self._len

    def restart(self, start: int, feats: torch.Tensor | None) -> None:
        self.kv.release()
        self.base = self.feat_start = start
        self.fed = 0
        self.feats = feats

    def add(self, start: int, feats: torch.Tensor) -> None:
        """Features of pairs ``start ..``; a gap or a rewrite of fed pairs restarts the head context.

        The buffer holds at most the sequence's unfed tokens (bounded by max_model_len), one
        feature row each: H values (3H for EAGLE-3) next to the target's 2 * layers * kv_size.
        """
        if self._buf is None or start > self.feat_end or start < max(self.base, self.feat_start):
            self.restart(start, feats)
            return
        keep = start - self.feat_start
        need = keep + feats.shape[0]
        buf = self._buf
        if not self._owned or need > buf.shape[0] or buf.dtype != feats.dtype:
            grown = feats.new_empty((max(need, 2 * buf.shape[0], 16), feats.shape[1]))
            grown[:keep] = buf[:keep]
            self._buf, self._owned = grown, True
        self._buf[keep:need] = feats
        self._len = need
        if start < self.base + self.fed:  # pairs recomputed by the target: their head KV is stale
            self.fed = start - self.base


class EagleProposer(Proposer):
    method = EAGLE
    needs_hidden = True
    builds_trees = True

    def __init__(self, target: TargetContext, head_dir: str | Path, spec: MethodSpec):
        if spec.speculative_token_tree is not None:
            log.warning("%s builds EAGLE-2 dynamic trees; speculative_token_tree only sizes them "
                        "(tree.budget/depth/topk = %s)", self.method, spec.tree)
        model = target.require_model(self.method)
        self.vocab_size = target.vocab_size
        self.dtype = target.dtype
        self.head = load_head(head_dir, model, self.method, dtype=target.dtype, device=target.device,
                              ops=target.ops, max_positions=target.max_model_len + MAX_TREE_BUDGET + 2)
        cfg = self.head.config
        self.aux_layers = tuple(sorted(set(cfg.target_aux_layers)))
        self._fusion_order = cfg.target_aux_layers
        missing = [j for j in self.aux_layers if j >= model.config.num_hidden_layers]
        if missing:
            raise CheckpointError(f"the EAGLE-3 head reads target layers {list(missing)}, beyond the target's "
                                  f"{model.config.num_hidden_layers}")
        self.tree = spec.tree
        self.pool = target.pool
        lc = cfg.layer
        # One KV layer per head layer (vLLM's multi-layer EAGLE-3 heads): a page holds every layer's entries.
        self.layout = self.pool.register(self.method, cfg.num_layers, lc.num_key_value_heads, lc.head_dim,
                                         target.dtype)
        self.device = target.device
        self._states: OrderedDict[str, _HeadState] = OrderedDict()  # least recently drafted first
        self.pool.add_reclaimer(self._reclaim)

    def max_budget(self) -> int:
        return self.tree.budget

    # -- features ---------------------------------------------------------------------------------

    def _raw_features(self, hidden: CommittedHidden) -> torch.Tensor:  # [n, H]
        return hidden.final  # EAGLE-1/2 read the target's hidden state after its final norm

    def on_commit(self, seq: SequenceView, hidden: CommittedHidden | None) -> None:
        if hidden is None or hidden.final.shape[0] == 0 or seq.arm != "spec":
            return  # canary "control" requests are never drafted: buffering their features would only grow
        feats = self._raw_features(hidden).detach()
        st = self._states.get(seq.request_id)
        if st is None:
            st = self._states[seq.request_id] = _HeadState(SequenceKV(self.pool, self.layout), hidden.start)
        st.add(hidden.start, feats)
        if st.kv.num_tokens > st.fed:  # verification is over: the draft entries are dead, free their pages
            st.kv.truncate(st.fed)

    def on_finish(self, seq: SequenceView) -> None:
        st = self._states.pop(seq.request_id, None)
        if st is not None:
            st.kv.release()

    def on_preempt(self, seq: SequenceView) -> None:
        self.on_finish(seq)  # the target re-prefills and re-sends every feature

    def _reclaim(self, pages_wanted: int) -> int:
        """Give pages back to the target: drop the least recently drafted head caches."""
        freed = 0
        for st in list(self._states.values()):
            if freed >= pages_wanted:
                break
            if st.kv.pages:
                freed += len(st.kv.pages)
                st.restart(st.feat_start, st.feats)  # keep the buffered features: a shorter context
        return freed

    # -- drafting ---------------------------------------------------------------------------------

    def _prepare(self, req: DraftRequest, extra_entries: int) -> tuple[_HeadState, Feed, torch.Tensor] | None:
        """Roll the head KV back to its committed pairs and build the catch-up feed ending at the root pair."""
        seq = req.seq
        st = self._states.get(seq.request_id)
        root_pair = len(seq.token_ids) - 2  # feature of the last committed token, then the root token
        if st is None or st.feats is None or root_pair < 0 or st.feat_end != root_pair + 1:
            return None  # features missing (never committed, or a step was lost): no draft this step
        self._states.move_to_end(seq.request_id)
        first = min(st.base + st.fed, root_pair)  # nothing new since the last draft: re-feed the root pair
        if first < st.feat_start:
            st.restart(st.feat_start, st.feats)  # (only after reclaim) restart at the buffered features
            first = st.feat_start
        st.fed = first - st.base
        st.kv.truncate(min(st.kv.num_tokens, st.fed))
        pairs = root_pair + 1 - first
        try:
            st.kv.reserve(st.fed + pairs + extra_entries, reclaim=False)
        except OutOfKVBlocks:
            return None  # no room for the head this step: the sequence decodes plainly
        tokens = seq.token_ids[first + 1: root_pair + 2]
        feed = Feed(st.kv, tokens, st.fed, logits=NO_LOGITS)
        return st, feed, st.feats[first - st.feat_start:]

    def _run(self, feeds: list[Feed], hidden: torch.Tensor) -> tuple[torch.Tensor, list[tuple[int, int]]]:
        """One paged head forward; ``hidden [T, H]`` in feed order.  Returns outputs [T, H] and feed rows."""
        inputs = build_inputs(feeds, self.device)
        out = self.head(inputs.input_ids, hidden, inputs.positions, self.layout.caches, inputs.meta)
        for f in feeds:
            f.kv.num_tokens = f.start + len(f.tokens)
        return out, inputs.token_rows

    def _logprobs(self, h: torch.Tensor, sampling: SamplingTensors | None) -> torch.Tensor:  # [N, H] -> [N, Vd]
        return draft_logprobs(self.head.logits(h), sampling)

    @torch.inference_mode()
    def propose(self, requests: list[DraftRequest], sampling: SamplingTensors) -> list[DraftTree | None]:
        k = min(self.tree.topk, max(r.budget for r in requests))
        depth = min(self.tree.depth, max(r.budget for r in requests))
        live, root_h = self._catch_up(requests, extra_entries=k * (depth - 1))  # every frontier but the last is fed
        out: list[DraftTree | None] = [None] * len(requests)
        if not live:
            return out
        idx = [i for i, _ in live]
        reqs = [requests[i] for i in idx]
        trees = DynamicTrees([r.seq.last_token for r in reqs], [r.budget for r in reqs], self.tree.topk,
                             self.tree.depth, device=root_h.device)
        stochastic = None if all(r.greedy for r in reqs) else sampling.select(idx)
        self._grow(trees, [st for _, st in live], root_h, stochastic)
        vocab = self.vocab_size
        for i, (tokens, parents) in zip(idx, trees.select()):
            out[i] = DraftTree.from_parents(tokens, parents, vocab_size=vocab)
        return out

    def _catch_up(self, requests: list[DraftRequest], extra_entries: int
                  ) -> tuple[list[tuple[int, _HeadState]], torch.Tensor]:
        """Feed every sequence's pending pairs in one forward; the root pairs' outputs ``[B, H]``."""
        live: list[tuple[int, _HeadState]] = []
        feeds: list[Feed] = []
        feats: list[torch.Tensor] = []
        for i, req in enumerate(requests):
            prepared = self._prepare(req, extra_entries)
            if prepared is not None:
                live.append((i, prepared[0]))
                feeds.append(prepared[1])
                feats.append(prepared[2])
        if not live:
            return live, torch.empty(0)
        h, rows = self._run(feeds, self.head.fuse(torch.cat(feats).to(self.dtype)))
        for (_, st), feed in zip(live, feeds):
            st.fed += len(feed.tokens)
            # Keep only the root pair's feature, to re-feed it if nothing new arrives before the next draft.
            st.feat_start, st.feats = st.feat_end - 1, st.feats[-1:]
        return live, h[torch.tensor([r0 + n - 1 for r0, n in rows], device=h.device)]

    def _grow(self, trees: DynamicTrees, states: list[_HeadState], root_h: torch.Tensor,
              sampling: SamplingTensors | None) -> None:
        """All levels of the trees: one tree-masked forward of the frontiers so far per level."""
        head = self.head
        trees.grow(self._logprobs(root_h, sampling)[:, None], head.draft_to_target)
        b, k, width = len(states), trees.k, root_h.shape[-1]
        # outputs[l] = the head's outputs at level l's frontier ([B, k, H]); level 0 is the root pair.
        outputs = [root_h[:, None].expand(b, k, width)]
        node_sampling = None if sampling is None else sampling.repeat([k] * b)
        while not trees.done:
            tokens, depths, mask = trees.fed_nodes()  # [B, M], [B, M], [B, M, M]
            inputs = [outputs[0]]  # level 1 reads the root pair's output; deeper nodes their parent's
            for level in range(2, trees.levels + 1):
                slots = trees.frontier_parent_slots(level)[:, :, None].expand(b, k, width)
                inputs.append(outputs[level - 1].gather(1, slots))
            tok_h, dep_h = tokens.tolist(), (depths - 1).tolist()
            feeds = [Feed(st.kv, tok_h[r], st.fed, depths=dep_h[r], tree_mask=mask[r], logits=NO_LOGITS)
                     for r, st in enumerate(states)]
            h, _ = self._run(feeds, torch.cat(inputs, dim=1).reshape(-1, width))
            h = h.view(b, trees.levels, k, width)
            outputs = [outputs[0]] + [h[:, level] for level in range(trees.levels)]
            last = outputs[-1].reshape(b * k, width)
            trees.grow(self._logprobs(last, node_sampling).view(b, k, -1), head.draft_to_target)


class Eagle3Proposer(EagleProposer):
    method = EAGLE3

    def _raw_features(self, hidden: CommittedHidden) -> torch.Tensor:  # [n, 3H]: low ; mid ; high
        if not self.head.config.use_fc:  # vLLM's use_aux_hidden_state false: the target's last hidden state
            return hidden.final
        return torch.cat([hidden.aux[j] for j in self._fusion_order], dim=-1)
