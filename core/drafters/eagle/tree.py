"""EAGLE-2 dynamic draft trees (Li et al. 2024, arXiv:2406.16858), grown for a whole batch at once.

Expansion.  Level 1 holds the root's ``k`` most likely children.  At every
further level the ``k`` candidates of the previous level with the highest
*cumulative* log-probability (the frontier) are fed to the head, and each
proposes its ``k`` most likely children: ``k * k`` new candidates whose score
is the parent's plus their own log-probability.  Only frontier nodes are fed,
so a level costs one head forward for every sequence of the batch.

Re-ranking.  After the last level, all candidates are ranked by cumulative
score and the best ``budget`` are kept.  A child's score is its parent's plus a
log-probability <= 0, so it never ranks above its parent; ties are broken by
depth (stable sort over level-ordered candidates), hence the kept set is
always ancestor-closed: the tree stays connected.  Kept nodes are emitted in
level order, so parents precede children (topological order).

Scores.  Greedy requests rank by the draft's log-softmax (EAGLE-2's rule).
Sampled requests rank by the log of the draft distribution processed like the
target's (temperature, top-k, top-p, min-p): a node's acceptance probability
is roughly the target's processed p of it, and tokens the target's top-k/top-p
removes (score -inf) are never proposed.  The drafts stay deterministic
(``draft_probs=None``): the verifier treats each as one-hot q, which is
lossless for distinct siblings (see ``hyspec.ops.rejection``).
"""
from __future__ import annotations

import torch

from hyspec.errors import HyspecError
from hyspec.ops.sampling import SamplingTensors


def draft_logprobs(
    logits: torch.Tensor,  # [N, V_draft] draft logits, one row per expanded node
    sampling: SamplingTensors | None,  # [N] rows, or None when every request is greedy
) -> torch.Tensor:  # [N, V_draft] fp32, <= 0 (-inf: never proposed)
    """Ranking scores: log-softmax for greedy rows, log of the processed draft q for sampled rows.

    Processing in the draft vocabulary equals processing the target-vocabulary
    scatter of the same logits (-inf elsewhere): top-k/top-p/min-p only ever
    keep finite entries and the softmax ignores -inf.
    """
    greedy = torch.log_softmax(logits.float(), dim=-1)
    if sampling is None:
        return greedy
    processed = sampling.to(logits.device).process(logits).clamp_min(0.0).log()
    rows = torch.tensor(sampling.is_greedy_host, device=logits.device)
    return torch.where(rows[:, None], greedy, processed)


class DynamicTrees:
    """The EAGLE-2 trees of ``B`` sequences, grown one level per head forward."""

    def __init__(self, roots: list[int], budgets: list[int], topk: int, depth: int,
                 device: torch.device | str = "cpu"):
        if not roots or len(roots) != len(budgets):
            raise HyspecError(f"DynamicTrees: {len(roots)} roots for {len(budgets)} budgets")
        if min(budgets) < 1 or topk < 1 or depth < 1:
            raise HyspecError(f"DynamicTrees: budgets, topk and depth must be >= 1 (got {budgets}, {topk}, {depth})")
        self.roots = roots
        self.budgets = budgets
        most = max(budgets)
        self.k = min(topk, most)  # frontier width = children per expanded node
        self.depth = min(depth, most)  # levels; a deeper node could never fit any budget
        self.device = torch.device(device)
        self.tokens: list[torch.Tensor] = []  # per level [B, C_l] target ids
        self.scores: list[torch.Tensor] = []  # per level [B, C_l] cumulative log-probabilities
        self.parent_slot: list[torch.Tensor] = []  # per level [B, C_l]: parent's frontier slot (-1: the root)
        self.frontiers: list[torch.Tensor] = []  # per level [B, k]: candidate index of each frontier slot

    @property
    def batch_size(self) -> int:
        return len(self.roots)

    @property
    def levels(self) -> int:
        return len(self.tokens)

    @property
    def done(self) -> bool:
        return self.levels >= self.depth

    def grow(self, logprobs: torch.Tensor, draft_to_target=None) -> None:
        """Add a level from ``logprobs [B, F, V_draft]``: F = 1 (the root) first, then F = k (the frontier).

        ``draft_to_target`` maps draft-vocabulary ids to target ids (EAGLE-3's d2t).
        """
        b, f = self.batch_size, (1 if not self.tokens else self.k)
        if self.done:
            raise HyspecError(f"DynamicTrees.grow: already {self.levels} levels deep (depth {self.depth})")
        if logprobs.dim() != 3 or logprobs.shape[:2] != (b, f):
            raise HyspecError(f"DynamicTrees.grow: logprobs must be [{b}, {f}, V], got {tuple(logprobs.shape)}")
        k = self.k
        # NaN would poison the ranking; log-probabilities are <= 0 by construction (clamp rounding).
        lp = torch.nan_to_num(logprobs.float(), nan=float("-inf")).clamp(max=0.0).to(self.device)
        values, ids = lp.topk(k, dim=-1)  # [B, F, k], distinct draft ids per parent
        if self.tokens:
            prev = self.scores[-1].gather(1, self.frontiers[-1])  # [B, k] frontier scores
            scores = prev[:, :, None] + values
            slots = torch.arange(f, device=self.device)[None, :, None].expand(b, f, k)
        else:
            scores = values
            slots = torch.full((b, 1, k), -1, dtype=torch.int64, device=self.device)
        tokens = ids if draft_to_target is None else draft_to_target(ids.to(logprobs.device)).to(self.device)
        self.tokens.append(tokens.reshape(b, f * k))
        self.scores.append(scores.reshape(b, f * k))
        self.parent_slot.append(slots.reshape(b, f * k))
        self.frontiers.append(self.scores[-1].topk(k, dim=1).indices)  # [B, k]

    # -- what the next head forward feeds ---------------------------------------------------------

    def frontier_tokens(self, level: int) -> torch.Tensor:  # [B, k] target ids of level `level` (1-based)
        return self.tokens[level - 1].gather(1, self.frontiers[level - 1])

    def frontier_parent_slots(self, level: int) -> torch.Tensor:  # [B, k]; -1 = the root
        """For each frontier slot of ``level``, the frontier slot of its parent one level up."""
        return self.parent_slot[level - 1].gather(1, self.frontiers[level - 1])

    def fed_nodes(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Every frontier so far as one tree per sequence, for the head's tree-masked forward.

        Returns ``tokens [B, M]``, ``depths [B, M]`` (1-based) and the
        ancestor-or-self mask ``[B, M, M]`` with ``M = levels * k``; node
        ``(l - 1) * k + s`` is slot ``s`` of level ``l``'s frontier.
        """
        b, k, n = self.batch_size, self.k, self.levels
        m = n * k
        tokens = torch.cat([self.frontier_tokens(level) for level in range(1, n + 1)], dim=1)
        depths = torch.arange(1, n + 1, device=self.device).repeat_interleave(k)[None].expand(b, m)
        mask = torch.zeros(b, m, m, dtype=torch.bool, device=self.device)
        rows = torch.arange(b, device=self.device)
        eye = torch.eye(k, dtype=torch.bool, device=self.device)
        mask[:, :k, :k] = eye
        for level in range(2, n + 1):
            lo = (level - 1) * k
            parent = (level - 2) * k + self.frontier_parent_slots(level)  # [B, k] fed index of the parent
            mask[:, lo:lo + k, :lo] = mask[rows[:, None], parent, :lo]
            mask[:, lo:lo + k, lo:lo + k] = eye
        return tokens, depths, mask

    # -- the final re-ranking ---------------------------------------------------------------------

    def select(self) -> list[tuple[list[int], list[int]]]:
        """Per sequence: ``(tokens, parents)`` of the kept tree, root first (``parents[0] = -1``)."""
        if not self.tokens:
            raise HyspecError("DynamicTrees.select: no level was grown")
        scores = torch.cat(self.scores, dim=1)  # [B, C], level order
        order = torch.sort(scores, dim=1, descending=True, stable=True).indices  # ties: shallower first
        finite = torch.isfinite(scores.gather(1, order))
        sizes = [c.shape[1] for c in self.tokens]
        offsets = [0]
        for size in sizes[:-1]:
            offsets.append(offsets[-1] + size)
        # Global index of every candidate's parent (-1: the root).
        parents = [self.parent_slot[0].new_full(self.parent_slot[0].shape, -1)]
        for level in range(1, len(sizes)):
            slot = self.parent_slot[level]
            parents.append(offsets[level - 1] + self.frontiers[level - 1].gather(1, slot))
        all_parents = torch.cat(parents, dim=1).tolist()
        all_tokens = torch.cat(self.tokens, dim=1).tolist()
        order_h, finite_h = order.tolist(), finite.tolist()
        out = []
        for b, budget in enumerate(self.budgets):
            chosen = [c for c, ok in zip(order_h[b], finite_h[b]) if ok][:budget]
            chosen.sort()  # level order: every parent before its children
            position = {c: i + 1 for i, c in enumerate(chosen)}
            tokens = [self.roots[b]] + [all_tokens[b][c] for c in chosen]
            tree_parents = [-1] + [0 if all_parents[b][c] < 0 else position[all_parents[b][c]] for c in chosen]
            out.append((tokens, tree_parents))
        return out
