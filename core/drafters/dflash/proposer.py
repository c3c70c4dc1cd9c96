"""``dflash``: one drafter forward per step drafts a whole chain (cost flat in its length).

Per sequence the drafter keeps, in the shared pool, the K/V its layers derive
from the committed tokens' context features (absorbed lazily from the rows
``on_commit`` buffers; they never need rolling back: they come from committed
target hidden states).  Each step writes the block ``[root, MASK x K]`` after
them, runs the layers once and drops the block's entries again.

Sampled requests draw every slot from its own processed distribution q_j
(``SamplingTensors.process``) with the request's generator.  Given the context
the slots are conditionally independent, so x_j ~ q_j whatever x_1..x_{j-1}
came out as; the chain verifier needs exactly that -- at depth j it tests x_j
against p(. | accepted prefix) with the q_j recorded for it, and x_j's law
given the (accepted) prefix is q_j -- so the standard min(1, p/q) acceptance
with residual resampling stays lossless.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from hyspec.drafters.dflash.cache import DraftStates, HiddenBuffer, shifted_inputs
from hyspec.drafters.dflash.checkpoint import load_drafter
from hyspec.drafters.dflash.model import DFlashConfig, DFlashDrafter
from hyspec.kv.pool import OutOfKVBlocks
from hyspec.kv.sequence_kv import SequenceKV
from hyspec.ops import OpTable
from hyspec.ops.sampling import SamplingTensors, draw_uniforms
from hyspec.seam.forward import NO_LOGITS, Feed
from hyspec.seam.proposer import CommittedHidden, DraftRequest, Proposer
from hyspec.seam.target import TargetContext
from hyspec.seam.tree import DraftTree
from hyspec.seam.views import SequenceView

if TYPE_CHECKING:
    from hyspec.drafters.methods import MethodSpec

log = logging.getLogger(__name__)


class _BlockState:
    __slots__ = ("kv", "offset", "pending")

    def __init__(self, kv: SequenceKV, offset: int):
        self.kv = kv
        self.offset = offset  # position of KV index 0 (> 0 after a restart)
        self.pending = HiddenBuffer(offset)  # context rows from position offset + kv.num_tokens on

    def release(self) -> int:
        freed = len(self.kv.pages)
        self.kv.release()
        return freed

    def settle(self) -> None:
        """Keep the absorbed context; drop block entries and unused reservations."""
        self.kv.truncate(self.pending.start - self.offset)


class Live:
    """One request drafted this step."""

    __slots__ = ("index", "req", "st", "n", "k")

    def __init__(self, index: int, req: DraftRequest, st: _BlockState, n: int, k: int):
        self.index, self.req, self.st, self.n, self.k = index, req, st, n, k


class DFlashProposer(Proposer):
    method = "dflash"
    needs_hidden = True

    def __init__(self, target: TargetContext, drafter: DFlashDrafter, max_tokens: int):
        self.drafter = drafter
        self.aux_layers = drafter.config.target_layers
        self.vocab_size = target.vocab_size
        self.device = target.device
        self.ops = target.ops
        self.pool = target.pool
        cfg = drafter.config.layers
        self.layout = self.pool.register(self.method, cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim,
                                         target.dtype)
        self.max_tokens = min(max_tokens, drafter.block_size)
        self.states: DraftStates[_BlockState] = DraftStates(_BlockState.release)
        self.pool.add_reclaimer(self.states.reclaim)

    @classmethod
    def from_spec(cls, target: TargetContext, spec: "MethodSpec", weights: Path) -> "DFlashProposer":
        """The proposer for ``spec`` with the drafter in ``weights`` (the dflash / dspark factories)."""
        model = target.require_model(cls.method)

        def build(config: DFlashConfig, section: dict[str, Any]):
            return cls.build_drafter(config, section, model.embed_tokens.weight, model.lm_head_weight,
                                     target.ops, target.max_model_len + config.block_size + 8)

        drafter = load_drafter(Path(weights), cls.method, model.config, build, target.dtype, target.device)
        return cls(target, drafter, spec.num_speculative_tokens)

    @staticmethod
    def build_drafter(config: DFlashConfig, section: dict[str, Any], embed, lm_head, ops, max_positions):
        return DFlashDrafter(config, embed, lm_head, ops=ops, max_positions=max_positions)

    def max_budget(self) -> int:
        return self.max_tokens

    # -- committed hidden states ----------------------------------------------------------------

    def on_commit(self, seq: SequenceView, hidden: CommittedHidden | None) -> None:
        if hidden is None or hidden.final.shape[0] == 0:
            return
        rows = torch.cat([hidden.aux[layer] for layer in self.aux_layers], dim=-1)  # [n, len(layers) * H]
        st = self.states.get(seq.request_id)
        if st is None or st.pending.end != hidden.start:
            st = _BlockState(SequenceKV(self.pool, self.layout), hidden.start)
            self.states.put(seq.request_id, st)
        st.pending.append(rows)

    def on_finish(self, seq: SequenceView) -> None:
        self.states.drop(seq.request_id)

    # -- drafting -------------------------------------------------------------------------------

    @torch.inference_mode()
    def propose(self, requests: list[DraftRequest], sampling: SamplingTensors) -> list[DraftTree | None]:
        K = self.drafter.block_size
        live: list[Live] = []
        for i, req in enumerate(requests):
            st = self.states.get(req.seq.request_id)
            n = len(req.seq.token_ids) - 1
            if st is None or st.pending.end != n:
                continue  # the target has not handed over the hidden states up to the root yet
            try:
                st.kv.reserve(n - st.offset + K + 1, reclaim=False)
            except OutOfKVBlocks:
                st.settle()
                continue  # no room for this draft this step: the sequence decodes plainly
            self.states.touch(req.seq.request_id)
            live.append(Live(i, req, st, n, min(req.budget, self.max_tokens)))
        out: list[DraftTree | None] = [None] * len(requests)
        if not live:
            return out
        try:
            self._absorb_context(live)
            hidden = self._run_blocks(live)  # [len(live), K+1, H]
            drafts = self.select(live, hidden, sampling)
        finally:
            for lv in live:
                lv.st.settle()
        for lv, (tokens, q) in zip(live, drafts):
            out[lv.index] = DraftTree.chain(lv.req.seq.last_token, tokens, draft_probs=q, vocab_size=self.vocab_size)
        return out

    def _absorb_context(self, live: list[Live]) -> None:
        """Write the K/V of every buffered context row into the sequences' caches (all draft layers)."""
        rows, positions, slots = [], [], []
        for lv in live:
            st = lv.st
            count = len(st.pending)
            if not count:
                continue
            start = st.pending.start - st.offset
            st.kv.check_writable(start, count)
            rows.append(st.pending.rows())
            positions.append(torch.arange(st.pending.start, st.pending.start + count))
            slots.append(st.kv.slot_tensor(start, count, self.device))
        if not rows:
            return
        feats = self.drafter.context(torch.cat(rows))
        pos = torch.cat(positions).to(self.device)
        slot_mapping = torch.cat(slots)
        for i, (k_cache, v_cache) in enumerate(self.layout.caches):
            k, v = self.drafter.context_kv(i, feats, pos)
            self.ops.write_kv(k, v, k_cache, v_cache, slot_mapping)
        for lv in live:
            st = lv.st
            st.kv.num_tokens = lv.n - st.offset
            st.pending.drop(len(st.pending))

    def _run_blocks(self, live: list[Live]) -> torch.Tensor:
        K1 = self.drafter.block_size + 1
        everything = torch.ones(K1, K1, dtype=torch.bool)  # non-causal within the block
        feeds = [Feed(lv.st.kv, [lv.req.seq.last_token] * K1, lv.n - lv.st.offset, tree_mask=everything,
                      logits=NO_LOGITS) for lv in live]
        inputs = shifted_inputs(feeds, [lv.st.offset for lv in live], self.device)
        is_mask = (torch.arange(K1) > 0).repeat(len(live)).to(self.device)
        hidden = self.drafter.forward_paged(inputs.input_ids, is_mask, inputs.positions, self.layout.caches,
                                            inputs.meta)
        for f in feeds:
            f.kv.num_tokens = f.start + K1
        return hidden.view(len(live), K1, -1)

    def select(self, live: list[Live], hidden: torch.Tensor, sampling: SamplingTensors
               ) -> list[tuple[list[int], torch.Tensor | None]]:
        """Per request: its draft tokens and their q rows (None for greedy requests)."""
        logits = self.drafter.logits(hidden[:, 1:])  # [B, K, V]: slot j predicts t[n+j]
        rows = sampling.select([lv.index for lv in live])
        tokens, q = sample_block(logits, rows, block_uniforms(live, logits.shape[1]), self.ops)
        return [(tokens[r, :lv.k].tolist(), None if lv.req.greedy else q[r, :lv.k]) for r, lv in enumerate(live)]


def block_uniforms(live: list[Live], K: int) -> torch.Tensor:  # [B, K] fp64
    """One uniform per draft slot of each sampled request, from its own generator (greedy rows: 0.5).

    A request draws exactly as many numbers as its own draft length, so a seeded
    request's random stream never depends on the batch around it.
    """
    counts = [0 if lv.req.greedy else lv.k for lv in live]
    drawn = draw_uniforms([lv.req.seq.generator for lv in live], counts)
    out = torch.full((len(live), K), 0.5, dtype=torch.float64)
    out[:, :drawn.shape[1]] = drawn
    return out


def sample_block(
    logits: torch.Tensor,  # [B, K, V] one block per row
    sampling: SamplingTensors,  # [B] rows
    uniforms: torch.Tensor,  # [B, K] fp64
    ops: OpTable,  # its ``sample`` draws the tokens from the injected uniforms
) -> tuple[torch.Tensor, torch.Tensor]:  # tokens [B, K] int64, q [B, K, V] fp32
    """Every slot drawn from its own processed distribution (one-hot argmax for greedy rows)."""
    B, K, V = logits.shape
    q = sampling.repeat([K] * B).process(logits.reshape(B * K, V))
    tokens = ops.sample(q, uniforms=uniforms.reshape(B * K).to(q.device))
    return tokens.view(B, K), q.view(B, K, V)
