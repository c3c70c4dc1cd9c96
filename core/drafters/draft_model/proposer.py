"""``draft_model``: an independent small LM drafts a chain, token ids only.

Its KV lives in the target's pool under its own owner and layout.  Draft
state catches up lazily: before drafting, the longest common prefix of what
the drafter has cached and what the target committed is kept and the rest is
(re)fed, so rejected drafts roll back and methods can switch freely.  When
the target needs pages, draft caches are given up first (they can always be
recomputed).
"""
from __future__ import annotations

import logging
from collections import OrderedDict
from pathlib import Path

import torch

from hyspec.errors import ConfigError
from hyspec.kv.pool import KVPool, OutOfKVBlocks
from hyspec.kv.sequence_kv import SequenceKV
from hyspec.model.loader import load_model
from hyspec.model.tokenizer import Tokenizer
from hyspec.ops.sampling import SamplingTensors
from hyspec.seam.forward import LAST_LOGITS, Feed, ModelRunner
from hyspec.seam.proposer import DraftRequest, Proposer
from hyspec.seam.target import TargetContext
from hyspec.seam.tree import DraftTree
from hyspec.seam.views import SequenceView

log = logging.getLogger(__name__)


class _DraftState:
    __slots__ = ("kv", "fed")

    def __init__(self, kv: SequenceKV):
        self.kv = kv
        self.fed: list[int] = []  # tokens whose draft KV is cached, in order


def check_same_tokenizer(target_dir: Path, draft_dir: Path, target_tok: Tokenizer) -> None:
    try:
        draft_tok = Tokenizer(draft_dir)
    except Exception as exc:
        raise ConfigError("speculative_config.model", f"the draft model in {draft_dir} has no usable tokenizer: {exc}")
    if draft_tok.get_vocab() != target_tok.get_vocab():
        raise ConfigError("speculative_config.model",
                          f"the draft model's tokenizer ({draft_dir}) differs from the target's ({target_dir}); "
                          "draft_model needs the same vocabulary")


class DraftModelProposer(Proposer):
    method = "draft_model"

    def __init__(self, target: TargetContext, model_dir: str | Path, max_tokens: int):
        model_dir = Path(model_dir)
        if target.tokenizer is not None:  # a remote worker compares vocabularies by fingerprint instead
            check_same_tokenizer(target.model_path, model_dir, target.tokenizer)
        self.model = load_model(model_dir, dtype=target.dtype, device=target.device, ops=target.ops,
                                max_positions=target.max_model_len + 128,
                                context_length=target.max_model_len)  # longrope: the target's factor rule
        cfg = self.model.config
        self.target_vocab = target.vocab_size
        self.pool: KVPool = target.pool
        self.layout = self.pool.register("draft_model", cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim,
                                         target.dtype)
        graphs = target.step_graphs(self.model, self.layout) if target.step_graphs is not None else None
        self.runner = ModelRunner(self.model, self.layout, target.device, graphs=graphs)
        self.max_tokens = max_tokens
        self._states: OrderedDict[str, _DraftState] = OrderedDict()  # least recently drafted first
        self.pool.add_reclaimer(self._reclaim)

    def max_budget(self) -> int:
        return self.max_tokens

    def _state(self, seq: SequenceView) -> _DraftState:
        st = self._states.get(seq.request_id)
        if st is None:
            st = self._states[seq.request_id] = _DraftState(SequenceKV(self.pool, self.layout))
        self._states.move_to_end(seq.request_id)
        return st

    def _sync(self, st: _DraftState, seq: SequenceView) -> list[int]:
        """Keep the longest valid cached prefix; return the tokens still to feed (ends with the last token)."""
        history = seq.token_ids
        valid = min(st.kv.num_tokens, len(history) - 1)
        while valid and st.fed[valid - 1] != history[valid - 1]:
            valid -= 1
        if valid < st.kv.num_tokens:
            st.kv.truncate(valid)
            del st.fed[valid:]
        return history[valid:]

    @torch.inference_mode()
    def propose(self, requests: list[DraftRequest], sampling: SamplingTensors) -> list[DraftTree | None]:
        live: list[tuple[int, DraftRequest, _DraftState]] = []
        feeds: list[Feed] = []
        for i, req in enumerate(requests):
            st = self._state(req.seq)
            todo = self._sync(st, req.seq)
            k = min(req.budget, self.max_tokens)
            try:
                st.kv.reserve(st.kv.num_tokens + len(todo) + k - 1, reclaim=False)
            except OutOfKVBlocks:
                continue  # no room for this draft this step: the sequence decodes plainly
            feeds.append(Feed(st.kv, todo, st.kv.num_tokens, logits=LAST_LOGITS))
            st.fed.extend(todo)
            live.append((i, req, st))
        drafts: dict[int, list[int]] = {i: [] for i, _, _ in live}
        probs: dict[int, list[torch.Tensor]] = {i: [] for i, _, _ in live}
        active = live
        while active and feeds:
            logits = self.runner.run(feeds).logits  # [len(active), V_draft]
            rows = torch.tensor([i for i, _, _ in active])
            q = sampling.select(rows).process(self._to_target_vocab(logits))
            gens = [req.seq.generator for _, req, _ in active]
            greedy = torch.tensor([req.greedy for _, req, _ in active])
            drawn = (q.argmax(-1) if bool(greedy.all())
                     else torch.where(greedy, q.argmax(-1), self.model.ops.sample(q, gens)))
            feeds, next_active = [], []
            for (i, req, st), tok, q_row in zip(active, drawn.tolist(), q):
                drafts[i].append(tok)
                if not req.greedy:
                    probs[i].append(q_row)
                if len(drafts[i]) < min(req.budget, self.max_tokens):
                    feeds.append(Feed(st.kv, [tok], st.kv.num_tokens))
                    st.fed.append(tok)
                    next_active.append((i, req, st))
            active = next_active
        out: list[DraftTree | None] = [None] * len(requests)
        for i, req, _ in live:
            q = torch.stack(probs[i]) if probs[i] else None
            out[i] = DraftTree.chain(req.seq.last_token, drafts[i], draft_probs=q, vocab_size=self.target_vocab)
        return out

    def _to_target_vocab(self, logits: torch.Tensor) -> torch.Tensor:
        """Draft logits over the target's vocabulary (padding rows differ between model sizes)."""
        v = self.target_vocab
        if logits.shape[1] == v:
            return logits
        if logits.shape[1] > v:
            return logits[:, :v]
        pad = logits.new_full((logits.shape[0], v - logits.shape[1]), float("-inf"))
        return torch.cat([logits, pad], dim=1)

    def _reclaim(self, pages_wanted: int) -> int:
        """Give pages back to the target: drop the least recently used draft caches."""
        freed = 0
        for rid in list(self._states):
            if freed >= pages_wanted:
                break
            st = self._states[rid]
            freed += len(st.kv.pages)
            st.kv.release()
            st.fed.clear()
        return freed

    def on_finish(self, seq: SequenceView) -> None:
        st = self._states.pop(seq.request_id, None)
        if st is not None:
            st.kv.release()

    def on_preempt(self, seq: SequenceView) -> None:
        self.on_finish(seq)
