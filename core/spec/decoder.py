"""The speculative step: choose a method and a budget, draft, verify, commit.

The engine calls, each step::

    plan = spec.plan(scheduler)              # method (dispatcher) + budget (goodput controller)
    sched = scheduler.schedule(plan.lookahead)
    trees = spec.propose(plan, sched.decodes) # DraftTree per sequence, or none
    ... one target forward over every prefill chunk, decode token and tree ...
    spec.verify(tree_items, result)          # lossless verification + KV commit
    spec.after_forward(...)                  # hidden states to proposers, metrics, controller

Failures never reach a request: a proposer that raises or returns garbage
makes that step plain for the sequences concerned, counted by cause.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import torch

from hyspec.engine.model_runner import ALL_LOGITS, Feed
from hyspec.engine.sequence import Sequence
from hyspec.errors import HyspecError, KVOwnershipError
from hyspec.ops.sampling import SamplingTensors
from hyspec.spec.config import SpeculativeConfig
from hyspec.spec.controller import GoodputController
from hyspec.spec.methods import MethodSpec, build_proposer
from hyspec.spec.metrics import SpecMetrics
from hyspec.spec.proposer import CommittedHidden, DraftRequest, Proposer
from hyspec.spec.quality import DraftQualityMonitor
from hyspec.spec.tree import DraftTree, TreeBatch
from hyspec.spec.verify import ACCEPTED, verify

log = logging.getLogger(__name__)

NONE = "none"


@dataclass
class StepPlan:
    method: str  # a loaded method, or "none"
    budget: int  # draft nodes per sequence (chain length for chain methods); 0 = plain step
    lookahead: int  # KV entries each decode reserves beyond its root
    batch_size: int
    reason: str = ""  # why the step is plain, for metrics ("budget_zero", "dispatcher", "load")


class SpecDecoder:
    def __init__(self, engine: Any, config: SpeculativeConfig, proposers: dict[str, Proposer],
                 controller: GoodputController, dispatcher: Any | None):
        self.engine = engine
        self.config = config
        self.proposers = proposers
        self.controller = controller
        self.dispatcher = dispatcher
        self.metrics = SpecMetrics(model_name=engine.model_path.name)
        self.quality = DraftQualityMonitor(config, self.metrics)
        self.aux_layers = tuple(sorted({layer for p in proposers.values() for layer in p.aux_layers}))
        self.needs_hidden = any(p.needs_hidden for p in proposers.values())
        canary_fraction = config.hybrid.speculative_fraction
        self._canary = None
        if canary_fraction < 1.0:
            from hyspec.dispatch.canary import Canary

            self._canary = Canary(canary_fraction)
        self._committed_nodes: dict[str, list[int]] = {}  # request -> tree rows kept last step
        self._draft_seconds = 0.0
        self._verify_seconds = 0.0
        self.last_plan: StepPlan | None = None

    # -- construction ----------------------------------------------------------------------------

    @classmethod
    def create(cls, engine: Any, speculative_config: dict | str | SpeculativeConfig) -> "SpecDecoder":
        if isinstance(speculative_config, SpeculativeConfig):
            cfg = speculative_config
        elif isinstance(speculative_config, str):
            cfg = SpeculativeConfig.from_json(speculative_config)
        else:
            cfg = SpeculativeConfig.from_dict(speculative_config)
        specs = _method_specs(cfg)
        proposers = {s.method: build_proposer(engine, s) for s in specs}
        for proposer in proposers.values():
            _optimize_modules(engine.backend, proposer)
        controller = GoodputController(cfg)
        if cfg.controller.enabled and cfg.controller.profile_at_startup:
            from hyspec.spec.profiling import profile_cost_model

            controller = GoodputController(cfg, profile_cost_model(engine))
        dispatcher = None
        if cfg.method == "hybrid":
            from hyspec.dispatch.dispatcher import HybridDispatcher

            h = cfg.hybrid
            dispatcher = HybridDispatcher(
                h.rules_path, list(proposers), load_threshold=h.load_threshold,
                load_resume_threshold=h.load_resume_threshold, speculative_fraction=h.speculative_fraction,
                load_signal=h.load_signal, max_batch_size=engine.scheduler.config.max_num_seqs)
        return cls(engine, cfg, proposers, controller, dispatcher)

    # -- request lifecycle ------------------------------------------------------------------------

    def on_add(self, seq: Sequence) -> None:
        if self._canary is not None:
            seq.arm = self._canary.arm(seq.request_id)

    def on_finish(self, seq: Sequence) -> None:
        self._committed_nodes.pop(seq.request_id, None)
        for p in self.proposers.values():
            p.on_finish(seq)

    def on_preempt(self, seq: Sequence) -> None:
        for p in self.proposers.values():
            p.on_preempt(seq)

    def on_tokens(self, seq: Sequence, offered: int, kept: int) -> None:
        """The engine appended ``kept`` of ``offered`` tokens (fewer when a stop rule cut the step)."""

    # -- planning ---------------------------------------------------------------------------------

    def plan(self, scheduler) -> StepPlan:
        running = scheduler.running
        decoding = [s for s in running if not s.in_prefill and s.arm == "spec"]
        batch = max(1, len(running))
        if self.dispatcher is not None:
            if not decoding:  # only prefills or control-arm requests: nothing to decide
                return self._remember(StepPlan(NONE, 0, 0, batch))
            method = self.dispatcher.choose(self._signals(scheduler))
            if method == NONE:
                return self._remember(StepPlan(NONE, 0, 0, batch, "dispatcher"))
        else:
            method = self.config.method
        if not decoding:
            return self._remember(StepPlan(method, 0, 0, batch))
        limit = self.config.disable_by_batch_size
        if limit is not None and batch >= limit:
            return self._remember(StepPlan(method, 0, 0, batch, "budget_zero"))
        proposer = self.proposers[method]
        if proposer.builds_trees:
            budget = self.controller.choose_tree_budget(method, batch)
        else:
            budget = self.controller.choose(method, batch)
        budget = min(budget, proposer.max_budget())
        return self._remember(StepPlan(method, budget, budget, batch, "" if budget else "budget_zero"))

    def _remember(self, plan: StepPlan) -> StepPlan:
        self.last_plan = plan
        if plan.reason == "budget_zero":
            self.metrics.record_rejection("budget_zero", plan.method)
        return plan

    def _signals(self, scheduler):
        from hyspec.dispatch.signals import StepSignals

        running = scheduler.running
        lengths = [len(s.token_ids) for s in running] or [0]
        accept = {}
        for m in self.proposers:
            a = self.controller.acceptance(m)
            if a:
                accept[m] = float(a[0])
        return StepSignals(
            context_length=sum(lengths) / len(lengths),
            batch_size=len(running),
            mem_usage=self.engine.pool.usage(),
            load=len(running) / scheduler.config.max_num_seqs,
            queue_depth=len(scheduler.waiting),
            remote_health=self.remote_health(),
            max_context_length=float(max(lengths)),
            accept_rate=accept,
        )

    def remote_health(self) -> float:
        scores = [p.health() for p in self.proposers.values() if hasattr(p, "health")]
        return min(scores) if scores else 1.0

    # -- drafting ---------------------------------------------------------------------------------

    def propose(self, plan: StepPlan, decodes: list[Sequence]) -> dict[str, DraftTree]:
        self._draft_seconds = 0.0
        if plan.budget <= 0 or plan.method == NONE:
            return {}
        max_len = self.engine.max_model_len
        requests = []
        for seq in decodes:
            if seq.arm != "spec":
                continue
            # Drafting past max_tokens or max_model_len would only produce tokens the stop rules drop.
            room = max_len - len(seq.token_ids)
            if seq.params.max_tokens is not None:
                room = min(room, seq.params.max_tokens - seq.num_output_tokens)
            budget = min(plan.budget, room - 1)
            if budget >= 1:
                requests.append(DraftRequest(seq, budget))
        if not requests:
            return {}
        proposer = self.proposers[plan.method]
        sampling = SamplingTensors.from_params([r.seq.params for r in requests])
        t0 = time.perf_counter()
        try:
            drafts = proposer.propose(requests, sampling)
        except KVOwnershipError as exc:
            log.warning("%s drafter wrote outside its KV pages (%s): plain step", plan.method, exc)
            self.metrics.record_rejection("kv_cache_mismatch", plan.method, count=len(requests))
            return {}
        except Exception:
            log.exception("%s drafter failed: this step decodes without speculation", plan.method)
            self.metrics.record_rejection("draft_unavailable", plan.method, count=len(requests))
            return {}
        self._draft_seconds = time.perf_counter() - t0
        trees: dict[str, DraftTree] = {}
        vocab = self.engine.config.vocab_size
        unavailable = 0
        for req, tree in zip(requests, drafts if len(drafts) == len(requests) else []):
            if tree is None or tree.num_nodes < 2:
                continue  # nothing worth proposing (a fault is recorded by the proposer itself)
            problem = _check_tree(tree, req, vocab)
            if problem:
                log.warning("%s drafter returned an unusable draft for %s: %s", plan.method, req.seq.request_id, problem)
                unavailable += 1
                continue
            trees[req.seq.request_id] = tree
        if len(drafts) != len(requests):
            log.warning("%s drafter returned %d drafts for %d requests", plan.method, len(drafts), len(requests))
            unavailable = len(requests)
        if unavailable:
            self.metrics.record_rejection("draft_unavailable", plan.method, count=unavailable)
        n_tokens = sum(t.num_nodes - 1 for t in trees.values())
        if n_tokens:
            self.controller.observe_draft_time(plan.method, n_tokens, self._draft_seconds)
        return trees

    def tree_feed(self, seq: Sequence, tree: DraftTree) -> Feed:
        n = tree.num_nodes
        is_chain = bool((tree.parents == torch.arange(-1, n - 1)).all())
        return Feed(seq.kv, tree.tokens.tolist(), seq.num_cached, depths=tree.depths.tolist(),
                    tree_mask=None if is_chain else tree.ancestor_mask(), logits=ALL_LOGITS)

    # -- verification and commit ------------------------------------------------------------------

    def verify(self, items: list[tuple[int, Sequence]], trees: dict[str, DraftTree], result) -> dict[str, list[int]]:
        """Verify every tree of the step in one call; commit accepted KV; return emitted tokens."""
        seqs = [seq for _, seq in items]
        batch = TreeBatch.from_trees([trees[s.request_id] for s in seqs], vocab_size=self.engine.config.vocab_size)
        logits = torch.cat([result.feed_logits(i) for i, _ in items])
        sampling = SamplingTensors.from_params([s.params for s in seqs])
        out = verify(logits, batch, sampling, [s.generator for s in seqs], ops=self.engine.backend.ops)
        emitted = out.emitted_tokens()
        nodes = out.accepted_nodes.tolist()
        counts = out.num_accepted.tolist()
        for (feed_index, seq), path, n_acc in zip(items, nodes, counts):
            kept = [0] + path[:n_acc]  # tree rows whose KV stays: root and accepted drafts
            self._commit_kv(seq, trees[seq.request_id].num_nodes, kept)
            self._committed_nodes[seq.request_id] = kept
        self._record(out, batch, seqs)
        return {s.request_id: toks for s, toks in zip(seqs, emitted)}

    def _commit_kv(self, seq: Sequence, num_nodes: int, kept: list[int]) -> None:
        """Move the kept nodes' KV into depth order after the context; drop the rest.

        Node ``i`` of the tree was written at KV index ``start + i``; the kept
        path's node at depth ``d`` must end up at ``start + d``.  A chain's
        accepted prefix is already in place (node index == depth): no copy.
        """
        start = seq.kv.num_tokens - num_nodes
        moves = [(start + node, start + depth) for depth, node in enumerate(kept) if node != depth]
        if moves:
            device = self.engine.device
            src = torch.tensor([seq.kv.slots(s, 1)[0] for s, _ in moves], dtype=torch.int64, device=device)
            dst = torch.tensor([seq.kv.slots(d, 1)[0] for _, d in moves], dtype=torch.int64, device=device)
            for k_cache, v_cache in self.engine.layout.caches:
                self.engine.backend.ops.compact_kv(k_cache, v_cache, src, dst)
        seq.kv.truncate(start + len(kept))

    def _record(self, out, batch: TreeBatch, seqs: list[Sequence]) -> None:
        plan = self.last_plan
        method = plan.method if plan else "unknown"
        outcome = out.position_outcome
        accepted_per_pos = (outcome == ACCEPTED).sum(0).tolist()
        causes: dict[str, int] = {}
        for c in out.rejection_cause:
            if c is not None:
                causes[c] = causes.get(c, 0) + 1
        n_draft = int((batch.num_nodes - 1).sum())
        n_acc = int(out.num_accepted.sum())
        self.metrics.record_step(method, "spec", len(seqs), n_draft, accepted_per_pos, causes,
                                 self._draft_seconds, self._verify_seconds)
        proposer = self.proposers.get(method)
        if proposer is not None and proposer.builds_trees:
            self.controller.observe_tree_acceptance(method, plan.budget, out.num_accepted.tolist())
        else:
            drafted = [int(((batch.depths >= d + 1) & batch.valid).any(1).sum()) for d in range(batch.max_depth)]
            self.controller.observe_acceptance(method, accepted_per_pos, len(seqs), drafted)
        self.quality.observe(method, n_acc, n_draft)

    # -- after the forward ------------------------------------------------------------------------

    def set_verify_seconds(self, seconds: float) -> None:
        self._verify_seconds = seconds

    def after_forward(self, kinds: list[tuple[str, Sequence]], feeds: list[Feed], result, forward_seconds: float) -> None:
        """Hand committed hidden states to every proposer; feed the cost model."""
        if self.needs_hidden:
            for i, ((kind, seq), feed) in enumerate(zip(kinds, feeds)):
                first, n = result.inputs.token_rows[i]
                if kind == "tree":
                    rows = [first + r for r in self._committed_nodes.get(seq.request_id, [0])]
                else:
                    rows = list(range(first, first + n))
                index = torch.tensor(rows, dtype=torch.int64, device=result.hidden.device)
                hidden = CommittedHidden(start=feed.start, final=result.hidden[index],
                                         aux={layer: h[index] for layer, h in result.aux_hidden.items()})
                for p in self.proposers.values():
                    if p.needs_hidden:
                        p.on_commit(seq, hidden)
        for p in self.proposers.values():
            observe = getattr(p, "observe_forward", None)  # remote drafters size their threads from it
            if observe is not None:
                observe(forward_seconds)
        decode_only = all(kind in ("decode", "tree") for kind, _ in kinds)
        if decode_only and kinds:
            tokens_per_seq = max(len(f.tokens) for f in feeds)
            self.controller.observe_step_time(len(feeds), tokens_per_seq, forward_seconds)

    # -- metrics ----------------------------------------------------------------------------------

    def register_prometheus(self, registry: Any = None) -> Any:
        return self.metrics.register_prometheus(registry)

    def close(self) -> None:
        for p in self.proposers.values():
            p.close()
        if self.dispatcher is not None:
            self.dispatcher.close()


def _optimize_modules(backend: Any, proposer: Proposer) -> None:
    """Let the backend prepare the drafter's torch modules (e.g. packed CPU weights)."""
    from torch import nn

    for value in vars(proposer).values():
        if isinstance(value, nn.Module):
            backend.optimize_model(value)


def _method_specs(cfg: SpeculativeConfig) -> list[MethodSpec]:
    top_k = cfg.num_speculative_tokens
    if cfg.method != "hybrid":
        return [MethodSpec(cfg.method, cfg.model, top_k, cfg.prompt_lookup_min, cfg.prompt_lookup_max, cfg)]
    specs = []
    if not cfg.hybrid.methods:
        return _default_hybrid_specs(cfg)
    for m in cfg.hybrid.methods:
        lookup_min = m.prompt_lookup_min or m.prompt_lookup_max or 5  # vLLM's rule: one given -> both
        lookup_max = m.prompt_lookup_max or m.prompt_lookup_min or 5
        specs.append(MethodSpec(m.method, m.model, m.num_speculative_tokens or top_k, lookup_min, lookup_max, cfg))
    return specs


#: Methods a bare {"method": "hybrid"} loads, when their embedded drafter exists (ngram needs none).
DEFAULT_HYBRID_METHODS = ("dflash", "mtp", "eagle", "eagle3", "dspark", "draft_model")


def _default_hybrid_specs(cfg: SpeculativeConfig) -> list[MethodSpec]:
    from hyspec.assets import DRAFTER_DIRS, assets_dir

    k = cfg.num_speculative_tokens
    specs = [MethodSpec("ngram", None, k, 1, 3, cfg)]
    for method in DEFAULT_HYBRID_METHODS:
        if (assets_dir() / DRAFTER_DIRS[method] / "config.json").is_file():
            specs.append(MethodSpec(method, None, k, 1, 3, cfg))
    log.info("hybrid with no methods listed: loading %s", [s.method for s in specs])
    return specs


def _check_tree(tree: DraftTree, req: DraftRequest, vocab: int) -> str | None:
    if tree.num_nodes > req.budget + 1:
        return f"{tree.num_nodes - 1} draft nodes for a budget of {req.budget}"
    if int(tree.tokens[0]) != req.seq.last_token:
        return "the root is not the sequence's last token"
    if int(tree.tokens.min()) < 0 or int(tree.tokens.max()) >= vocab:
        return "a draft token is outside the vocabulary"
    q = tree.draft_probs
    if q is not None:
        if q.shape[1] != vocab:
            return f"draft probabilities over {q.shape[1]} tokens, the target has {vocab}"
        rows = q[1:]
        if not bool(torch.isfinite(rows).all()) or bool((rows < 0).any()):
            return "draft probabilities contain NaN, inf or negatives"
        drawn = rows.gather(1, tree.tokens[1:, None]).squeeze(1)
        if bool((drawn <= 0).any()):
            return "a draft token has zero draft probability"
    elif not req.greedy:
        pass  # deterministic drafts are fine at any temperature (one-hot q)
    return None
