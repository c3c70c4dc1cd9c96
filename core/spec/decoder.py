"""Speculative decoding as the engine's strategy: choose a method and budget, draft, verify, commit.

:class:`SpecDecoder` implements :class:`~hyspec.spec.strategy.Speculation`;
the step order and what crosses the seam are documented there and in
``LLMEngine.step``.  Here: the policy (:mod:`hyspec.policy`, one chain of
gates run once per step) decides whether the step speculates, with which
method and how deep; the proposer drafts; :func:`hyspec.spec.verify.verify`
accepts losslessly; accepted nodes' KV is compacted into place; committed
hidden states go back to every proposer, and the step's cost to the policy.

Nothing is kept on the decoder from one call for the next: the plan carries
the step's start time, ``Drafts`` the drafting time, and ``Accepted`` both on
to :meth:`SpecDecoder.observe`.

Failures never reach a request: a proposer that raises or returns garbage
makes that step plain for the sequences concerned, counted by cause.
"""
from __future__ import annotations

import logging
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import torch

from hyspec.errors import KVOwnershipError
from hyspec.model.quantize_drafter import describe, quantize_drafter
from hyspec.ops.sampling import SamplingTensors
from hyspec.policy.build import Policy, build_policy
from hyspec.policy.chain import StepState, remote_health
from hyspec.policy.controller import GoodputController
from hyspec.policy.residency import holds_memory, release_proposer
from hyspec.policy.wave import WaveTracker, critical_rows
from hyspec.seam.proposer import CommittedHidden, DraftRequest, Proposer
from hyspec.seam.step import RowKind, TargetRun
from hyspec.seam.target import TargetContext
from hyspec.seam.tree import DraftTree, TreeBatch
from hyspec.spec.config import SpeculativeConfig
from hyspec.spec.methods import MethodSpec, build_proposer, method_specs
from hyspec.spec.metrics import SpecMetrics
from hyspec.spec.quality import DraftQualityMonitor
from hyspec.spec.strategy import NONE, Accepted, Drafts, Speculation, StepPlan
from hyspec.spec.verify import ACCEPTED, verify
from hyspec.spec.verify_controls import apply_tree_processors, cut_forbidden_drafts

if TYPE_CHECKING:
    from hyspec.policy.dispatcher import HybridDispatcher
    from hyspec.policy.residency import DrafterResidency
    from hyspec.policy.slo import TTFTGuard
    from hyspec.seam.forward import Feed
    from hyspec.seam.views import EngineSequenceView as Sequence
    from hyspec.seam.views import SchedulerView, ScheduleView

log = logging.getLogger(__name__)


class SpecDecoder(Speculation):
    def __init__(self, target: TargetContext, config: SpeculativeConfig, proposers: dict[str, Proposer],
                 policy: Policy, metrics: SpecMetrics, specs: dict[str, MethodSpec] | None = None):
        self.target = target
        self.config = config
        self.proposers = proposers
        self.specs = specs or {}  # how to rebuild a proposer released under memory pressure
        self.policy = policy
        self.metrics = metrics
        self.quality = DraftQualityMonitor(config, self.metrics)
        self.waves = WaveTracker()  # the step each running request first appeared in
        self.aux_layers = tuple(sorted({layer for p in proposers.values() for layer in p.aux_layers}))
        self.needs_hidden = any(p.needs_hidden for p in proposers.values())
        for method, p in proposers.items():
            if holds_memory(p):
                self.metrics.ops.register_drafter(method)

    # the policy's mechanisms, under the names tests and metrics read them by
    @property
    def controller(self) -> GoodputController:
        return self.policy.controller

    @property
    def dispatcher(self) -> "HybridDispatcher | None":
        return self.policy.dispatcher

    @property
    def residency(self) -> "DrafterResidency":
        return self.policy.residency

    @property
    def slo(self) -> "TTFTGuard":
        return self.policy.slo

    # -- construction ----------------------------------------------------------------------------

    @classmethod
    def create(cls, target: TargetContext, speculative_config: dict | str | SpeculativeConfig) -> "SpecDecoder":
        if isinstance(speculative_config, SpeculativeConfig):
            cfg = speculative_config
        elif isinstance(speculative_config, str):
            cfg = SpeculativeConfig.from_json(speculative_config)
        else:
            cfg = SpeculativeConfig.from_dict(speculative_config)
        specs = method_specs(cfg)
        proposers = {s.method: build_proposer(target, s) for s in specs}
        for method, proposer in proposers.items():
            _optimize_modules(target, proposer, cfg.quantization, method)
        metrics = SpecMetrics(model_name=target.model_path.name if target.model_path else "unknown")
        caps = [(s.method, s.num_speculative_tokens) for s in specs]
        policy = build_policy(cfg, target, proposers, caps, metrics)
        return cls(target, cfg, proposers, policy, metrics, {s.method: s for s in specs})

    # -- request lifecycle ------------------------------------------------------------------------

    def admit(self, seq: Sequence) -> None:
        seq.arm = self.policy.arm(seq.request_id)

    def release(self, seq: Sequence) -> None:
        for p in self.proposers.values():
            p.on_finish(seq)
        self.policy.request_finished(seq.metrics.ttft)

    # -- memory pressure: the policy decides, the decoder owns the drafters ------------------------

    def _release_drafter(self, method: str, scheduler: "SchedulerView") -> None:
        proposer = self.proposers.pop(method)
        release_proposer(proposer, self.target.pool, [*scheduler.running, *scheduler.waiting])
        self.needs_hidden = any(p.needs_hidden for p in self.proposers.values())

    def _reload_drafter(self, method: str) -> None:
        proposer = build_proposer(self.target, self.specs[method])
        _optimize_modules(self.target, proposer, self.config.quantization, method)
        self.proposers[method] = proposer
        self.needs_hidden = any(p.needs_hidden for p in self.proposers.values())

    # -- planning ---------------------------------------------------------------------------------

    def plan(self, scheduler: "SchedulerView") -> StepPlan:
        started = time.perf_counter()  # the step's wall time teaches the controller and the bandit (observe)
        running = scheduler.running
        step = StepState(
            scheduler=scheduler,
            decoding=[s for s in running if not s.in_prefill and s.arm == "spec"],
            batch=max(1, len(running)),
            proposers=self.proposers,
            release=lambda method: self._release_drafter(method, scheduler),
            reload=self._reload_drafter,
        )
        if self._wave_rule_on():  # stamped when first queued: a wave's prompts may take many steps to prefill
            self.waves.follow(s.request_id for s in [*running, *scheduler.waiting])
        return replace(self.policy.plan(step), started=started, wave=self._is_wave(scheduler))

    def _is_wave(self, scheduler: "SchedulerView") -> bool:
        """Whether the running batch is a wave (hyspec.policy.wave): its requests admitted together, none
        waiting for a place, and room for more, so no request can be waiting on a row to finish."""
        return (self._wave_rule_on() and not scheduler.waiting
                and len(scheduler.running) < scheduler.config.max_num_seqs and self.waves.admitted_together())

    def _wave_rule_on(self) -> bool:
        return self.config.controller.enabled and self.config.controller.wave_makespan

    def remote_health(self) -> float:
        return remote_health(self.proposers)

    # -- drafting ---------------------------------------------------------------------------------

    def draft(self, plan: StepPlan, scheduled: "ScheduleView") -> Drafts:
        for seq in scheduled.preempted:
            for p in self.proposers.values():
                p.on_preempt(seq)
        prefilling = [seq for seq, _ in scheduled.prefills if seq.arm == "spec"]
        for p in self.proposers.values():  # every step, empty too: what a proposer holds is this step's
            p.on_prefill(prefilling)
        if plan.budget <= 0 or plan.method == NONE:
            return Drafts(plan)
        proposer = self.proposers.get(plan.method)  # looked up as _propose does: only once a row asks for a draft
        scored = proposer is not None and proposer.scores_drafts
        if scored and not self.controller.should_draft(plan.method):
            return Drafts(plan)  # drafting has not paid for itself lately (hyspec.policy.draft_value)
        t0 = time.perf_counter()
        trees, seconds = self._propose(plan, scheduled.decodes, [seq for seq, _ in scheduled.prefills])
        if scored:
            self.controller.drafting_value(plan.method).drafted(time.perf_counter() - t0)
        return Drafts(plan, trees, seconds)

    def _propose(self, plan: StepPlan, decodes: list[Sequence], prefilling: list[Sequence]
                 ) -> tuple[dict[str, DraftTree], float]:
        max_len = self.target.max_model_len
        remaining = self._wave_remaining([*decodes, *prefilling]) if plan.wave else None
        # in a wave, a row more than the budget ahead of the slowest cannot be on its critical path: not drafted
        behind = max(remaining.values()) - plan.budget if remaining else 0
        requests = []
        for seq in decodes:
            if seq.arm != "spec" or (remaining and remaining[seq.request_id] < behind):
                continue
            # Drafting past max_tokens or max_model_len would only produce tokens the stop rules drop.
            budget = min(plan.budget, _tokens_left(seq, max_len) - 1)
            if budget >= 1:
                requests.append(DraftRequest(seq, budget))
        if not requests:
            return {}, 0.0
        proposer = self.proposers[plan.method]
        sampling = SamplingTensors.from_params([r.seq.params for r in requests])
        t0 = time.perf_counter()
        try:
            if remaining and proposer.drafts_rows_independently:
                drafts = self._propose_wave(proposer, requests, sampling, remaining)
            else:
                drafts = proposer.propose(requests, sampling)
        except KVOwnershipError as exc:
            log.warning("%s drafter wrote outside its KV pages (%s): plain step", plan.method, exc)
            self.metrics.record_rejection("kv_cache_mismatch", plan.method, count=len(requests))
            return {}, 0.0
        except Exception:
            log.exception("%s drafter failed: this step decodes without speculation", plan.method)
            self.metrics.record_rejection("draft_unavailable", plan.method, count=len(requests))
            return {}, 0.0
        finally:
            for cause, count in proposer.take_faults().items():
                self.metrics.record_rejection(cause, plan.method, count=count)
        seconds = time.perf_counter() - t0
        trees: dict[str, DraftTree] = {}
        vocab = self.target.vocab_size
        unavailable = 0
        for req, tree in zip(requests, drafts if len(drafts) == len(requests) else []):
            if tree is None or tree.num_nodes < 2:
                continue  # nothing worth proposing (a fault is recorded by the proposer itself)
            problem = _check_tree(tree, req, vocab)
            if problem:
                log.warning("%s drafter returned an unusable draft for %s: %s", plan.method, req.seq.request_id, problem)
                unavailable += 1
                continue
            tree = cut_forbidden_drafts(tree, req.seq)  # drafts the request's processors forbid are never verified
            if tree.num_nodes >= 2:
                trees[req.seq.request_id] = tree
        if len(drafts) != len(requests):
            log.warning("%s drafter returned %d drafts for %d requests", plan.method, len(drafts), len(requests))
            unavailable = len(requests)
        if unavailable:
            self.metrics.record_rejection("draft_unavailable", plan.method, count=unavailable)
        if remaining and trees:
            trees = self._wave_cut(plan.method, remaining, trees)
        n_tokens = sum(t.num_nodes - 1 for t in trees.values())
        if n_tokens:
            self.controller.observe_draft_time(plan.method, n_tokens, seconds)
        if proposer.scores_drafts:
            trees = self.controller.size_scored(plan.method, plan.batch_size, trees)
        return trees, seconds

    @staticmethod
    def _propose_wave(proposer: Proposer, requests: list[DraftRequest], sampling: SamplingTensors,
                      remaining: dict[str, int]) -> list[DraftTree | None]:
        """Drafts for a wave's ``requests`` one row at a time, most tokens left first, stopping once no row left
        can be on the wave's critical path (``critical_rows``): a row with nothing to draft lasts at least as
        long as every row with no more left than it.  When every row has as many left (a bench pass, a burst
        of equal requests) the first row without a draft ends the step's drafting, where drafting them all
        cost a suffix step 1.1 ms at batch 8 (docs/results/2026-12-07/spec-cost-batch-zen4/)."""
        out: list[DraftTree | None] = [None] * len(requests)
        asked = {req.seq.request_id for req in requests}
        floor = max((left for rid, left in remaining.items() if rid not in asked), default=-1)
        for i in sorted(range(len(requests)), key=lambda i: -remaining[requests[i].seq.request_id]):
            left = remaining[requests[i].seq.request_id]
            if left <= floor:
                break  # this row and every one after it would be cut by _wave_cut
            tree = proposer.propose([requests[i]], sampling.select([i]))[0]
            out[i] = tree
            if tree is None or tree.num_nodes < 2:
                floor = max(floor, left)
        return out

    def _wave_remaining(self, rows: list[Sequence]) -> dict[str, int] | None:
        """Each row's tokens left before its ``max_tokens`` (decoding or prefilling); None when a row has no
        ``max_tokens``: the batch's end is then unknown, and the wave rule stays out."""
        if any(seq.params.max_tokens is None for seq in rows):
            return None
        return {seq.request_id: _tokens_left(seq, self.target.max_model_len) for seq in rows}

    def _wave_cut(self, method: str, remaining: dict[str, int], trees: dict[str, DraftTree]) -> dict[str, DraftTree]:
        """``trees`` less those of rows off the wave's critical path (counted as rejections ``off_critical_path``)."""
        keep = critical_rows(remaining, {rid: int(tree.depths.max()) for rid, tree in trees.items()})
        if len(keep) < len(trees):
            self.metrics.record_rejection("off_critical_path", method, count=len(trees) - len(keep))
        return {rid: tree for rid, tree in trees.items() if rid in keep}

    def abandon(self, drafts: Drafts, cause: str) -> Drafts:
        self.metrics.record_rejection(cause, drafts.plan.method, count=len(drafts.trees))
        return Drafts(drafts.plan, seconds=drafts.seconds)  # the drafting time was spent all the same

    # -- verification and commit ------------------------------------------------------------------

    def accept(self, run: TargetRun, drafts: Drafts) -> Accepted:
        """Verify every tree of the step in one call; commit accepted KV; return emitted tokens."""
        index = run.indices(RowKind.TREE)
        if not index:
            return Accepted(plan=drafts.plan, draft_seconds=drafts.seconds)
        seqs = [run.rows[i].seq for i in index]
        trees = [drafts.trees[s.request_id] for s in seqs]
        logits = torch.cat([run.result.feed_logits(i) for i in index])
        logits = apply_tree_processors(logits, seqs, trees)  # each row's law: the request's controls at its path
        batch = TreeBatch.from_trees(trees, vocab_size=self.target.vocab_size, device=logits.device)
        sampling = SamplingTensors.from_params([s.params for s in seqs])
        out = verify(logits, batch, sampling, [s.generator for s in seqs], ops=self.target.ops)
        emitted = out.emitted_tokens()
        kept_rows: dict[str, list[int]] = {}
        for seq, tree, path, n_acc in zip(seqs, trees, out.accepted_nodes.tolist(), out.num_accepted.tolist()):
            kept = [0] + path[:n_acc]  # tree rows whose KV stays: root and accepted drafts
            self._commit_kv(seq, tree.num_nodes, kept)
            kept_rows[seq.request_id] = kept
        self._record(out, batch, seqs, drafts, run.seconds)
        return Accepted({s.request_id: toks for s, toks in zip(seqs, emitted)}, kept_rows,
                        plan=drafts.plan, draft_seconds=drafts.seconds)

    def _commit_kv(self, seq: Sequence, num_nodes: int, kept: list[int]) -> None:
        """Move the kept nodes' KV into depth order after the context; drop the rest.

        Node ``i`` of the tree was written at KV index ``start + i``; the kept
        path's node at depth ``d`` must end up at ``start + d``.  A chain's
        accepted prefix is already in place (node index == depth): no copy.
        """
        start = seq.kv.num_tokens - num_nodes
        moves = [(start + node, start + depth) for depth, node in enumerate(kept) if node != depth]
        if moves:
            device = self.target.device
            src = torch.tensor([seq.kv.slots(s, 1)[0] for s, _ in moves], dtype=torch.int64, device=device)
            dst = torch.tensor([seq.kv.slots(d, 1)[0] for _, d in moves], dtype=torch.int64, device=device)
            for k_cache, v_cache in self.target.layout.caches:
                self.target.ops.compact_kv(k_cache, v_cache, src, dst)
        seq.kv.truncate(start + len(kept))

    def _record(self, out, batch: TreeBatch, seqs: list[Sequence], drafts: Drafts, verify_seconds: float) -> None:
        plan = drafts.plan
        method = plan.method
        outcome = out.position_outcome
        accepted_per_pos = (outcome == ACCEPTED).sum(0).tolist()
        causes: dict[str, int] = {}
        for c in out.rejection_cause:
            if c is not None:
                causes[c] = causes.get(c, 0) + 1
        n_draft = int((batch.num_nodes - 1).sum())
        n_acc = int(out.num_accepted.sum())
        self.metrics.record_step(method, "spec", len(seqs), n_draft, accepted_per_pos, causes,
                                 drafts.seconds, verify_seconds)
        for seq, nodes, accepted in zip(seqs, batch.num_nodes_host, out.num_accepted.tolist()):
            seq.metrics.num_spec_steps += 1  # RequestOutput.metrics: what speculation did for this request
            seq.metrics.num_draft_tokens += nodes - 1
            seq.metrics.num_accepted_tokens += accepted
        proposer = self.proposers.get(method)
        if proposer is not None and proposer.scores_drafts:
            for seq, path, n_acc in zip(seqs, out.accepted_nodes.tolist(), out.num_accepted.tolist()):
                self.controller.observe_scored(method, drafts.trees[seq.request_id], path[:n_acc])
        elif proposer is not None and proposer.builds_trees:
            self.controller.observe_tree_acceptance(method, plan.budget, out.num_accepted.tolist())
        else:
            drafted = [int(((batch.depths >= d + 1) & batch.valid).any(1).sum()) for d in range(batch.max_depth)]
            self.controller.observe_acceptance(method, accepted_per_pos, len(seqs), drafted)
        self.quality.observe(method, n_acc, n_draft)

    # -- after the forward ------------------------------------------------------------------------

    def observe(self, run: TargetRun, accepted: Accepted) -> None:
        """Hand committed hidden states to every proposer; the step's costs to the policy."""
        if self.needs_hidden:
            for i, (row, feed) in enumerate(zip(run.rows, run.feeds)):
                first, n = run.result.inputs.token_rows[i]
                if row.kind is RowKind.TREE:
                    rows = [first + r for r in accepted.kept_rows.get(row.seq.request_id, [0])]
                    index = torch.tensor(rows, dtype=torch.int64, device=run.result.hidden.device)
                else:  # contiguous rows: a slice, not a tensor built and gathered per sequence and step
                    index = slice(first, first + n)
                hidden = CommittedHidden(start=feed.start, final=run.result.hidden[index],
                                         aux={layer: h[index] for layer, h in run.result.aux_hidden.items()})
                # samples forked from this prefill continue from the same committed prompt
                for seq in [row.seq, *run.forks.get(row.seq.request_id, ())]:
                    for p in self.proposers.values():
                        if p.needs_hidden:
                            p.on_commit(seq, hidden)
        for p in self.proposers.values():
            p.observe_forward(run.seconds)
        if run.rows and all(row.kind.decodes for row in run.rows):
            self.controller.observe_step_time(len(run.feeds), mean_tokens_per_seq(run.feeds), run.seconds)
            # the rest of the step so far (plan, tree building, verification, KV commit): see controller.py
            started = accepted.plan.started
            host = time.perf_counter() - started - run.seconds - accepted.draft_seconds
            self.controller.observe_host_time(len(run.feeds), any(r.kind is RowKind.TREE for r in run.rows), host)
            if self.dispatcher is not None:  # committed tokens over the whole step: plan, draft, forward, verify
                committed = sum(len(accepted.tokens.get(row.seq.request_id, ())) if row.kind is RowKind.TREE else 1
                                for row in run.rows)
                self.policy.observe_step(committed, time.perf_counter() - started)

    # -- metrics ----------------------------------------------------------------------------------

    def register_prometheus(self, registry: Any = None) -> Any:
        """The speculation metrics, and those of any proposer that exports its own (remote drafting's
        ``hyspec_remote_*``: calls, failovers, drafts by source)."""
        collector = self.metrics.register_prometheus(registry)
        for proposer in self.proposers.values():
            register = getattr(proposer, "register_prometheus", None)
            if register is not None:
                register(registry)
        return collector

    def forget_shared_history(self) -> None:
        for p in self.proposers.values():
            p.forget_shared_history()

    def close(self) -> None:
        for p in self.proposers.values():
            p.close()
        self.policy.close()


def _optimize_modules(target: TargetContext, proposer: Proposer, quantization: str | None = None,
                      method: str = "") -> None:
    """Let the backend prepare the drafter's torch modules: its linears on the backend's weight-only kernels
    (``quantization``, hyspec.model.quantize_drafter), then whatever else it does (packed CPU weights)."""
    from torch import nn


    for name, value in vars(proposer).items():
        if isinstance(value, nn.Module):
            kinds = quantize_drafter(value, quantization, target.backend)
            if kinds:
                log.info("%s drafter %s: linear layers %s", method, name, describe(kinds))
            target.backend.optimize_model(value)


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
    return None  # without q a draft is a point proposal (one-hot q), fine at any temperature


def mean_tokens_per_seq(feeds: "list[Feed]") -> float:
    """What a step verified per sequence, for the cost model: the mean, so that batch x tokens is the step's
    total rows -- what the packed forward costs.  The longest feed overstated it: with drafts cut to the
    sequences they pay for (suffix decoding at batch 8: one sequence 31 rows, seven 1), the step read as
    8 x 31 = 248 rows while it ran 38 (45 ms here; 248 rows take 273 ms), the online refit learnt that
    rows are nearly free, and the sizer kept drafts that lost to plain decoding (docs/results/2026-12-05/
    cost-model-rows/)."""
    return sum(len(f.tokens) for f in feeds) / len(feeds)


def _tokens_left(seq: "Sequence", max_model_len: int) -> int:
    """Tokens ``seq`` may still emit: before its ``max_tokens`` (when set) and before ``max_model_len``."""
    room = max_model_len - len(seq.token_ids)
    if seq.params.max_tokens is not None:
        room = min(room, seq.params.max_tokens - seq.num_output_tokens)
    return room
