"""Sizing scored drafts after drafting: which of each draft's nodes are worth verifying this step.

Why.  A model-free drafter such as suffix decoding knows, draft by draft, how sure it is: a request
re-run by an agent matches its own earlier response and continues it verbatim; a two-token match in
the prompt rarely continues.  The goodput controller's per-method estimates (one acceptance curve,
or one accepted length per tree budget) average the two.  On the agentic workload at batch 8 that
average said verification costs more than it returns, the controller stopped drafting, and the
re-run requests, whose drafts were accepted whole, decoded one token a step.

How.  Drafts of a scored method (``Proposer.scores_drafts``) are made at the full budget (no model
runs, so it is cheap), and then, for the step as a whole:

1. Calibrate.  A node's own estimate c (``NodeScores.conditional``: its share of the matched
   occurrences) is mapped to a measured conditional acceptance a(cell), the cell being (source,
   match-length bucket, c bucket).  Every verified node whose parent was accepted is one sample of
   its cell (accepted or not), forgotten exponentially (``NODE_ALPHA`` per sample).  A cell never seen
   starts at ``prior`` (optimistic, so it gets tried), weighted as ``PRIOR_WEIGHT`` samples.
2. Path acceptance.  P_i = the product of a along node i's path.  It only falls along a path, so
   ranking nodes by P puts parents before children.
3. Choose.  Over every node of the batch ranked by P, keep the top N that maximise
   ``(b + sum of their P) / (T(b, 1 + N / b) + host)`` -- committed tokens per second, T the cost
   model of a target step -- if that beats plain decoding's ``b / (T(b, 1) + host_plain)`` by the
   controller's ``min_gain``; else verify nothing (a plain step).
4. Explore.  After ``explore_interval`` steps sized to nothing, one step verifies every draft whole,
   so a cell's stale low estimate cannot switch a workload off for good.

Lossless by construction: a dropped node is only not verified, and the kept nodes form a tree.
"""
from __future__ import annotations

import bisect
from typing import Callable, Mapping

from hyspec.seam.tree import DraftTree

#: match-length bucket edges: [0, 2), [2, 4), [4, 8), [8, 16), [16, 32), [32, ...)
MATCH_EDGES = (2, 4, 8, 16, 32)
#: conditional-estimate bucket edges: [0, .25), [.25, .5), [.5, .99), [.99, 1]
CONDITIONAL_EDGES = (0.25, 0.5, 0.99)
#: samples the prior counts for in a cell's estimate
PRIOR_WEIGHT = 2.0
#: forgetting per node sample: a window of ~200 samples.  Nodes come by the dozen per step, and with the
#: controller's per-step alpha (0.05) a cell's window was ~20 samples, so the prior's two kept it under
#: 0.98 even when every draft was accepted whole -- 0.98^48 = 0.38 cut re-run drafts short at depth ~10
NODE_ALPHA = 0.005

Cell = tuple[int, int, int]


def cell_of(source: int, match_length: int, conditional: float) -> Cell:
    return source, bisect.bisect_right(MATCH_EDGES, match_length), bisect.bisect_right(CONDITIONAL_EDGES, conditional)


class DraftSizer:
    """One scored method's calibration and its per-step choice of nodes."""

    def __init__(self, prior: float, explore_interval: int, alpha: float = NODE_ALPHA):
        self.prior = prior
        self.alpha = alpha
        self.explore_interval = explore_interval
        self._accepted: dict[Cell, float] = {}
        self._reached: dict[Cell, float] = {}
        self.empty_streak = 0  # consecutive steps sized to nothing
        self.last_choice: tuple[int, float] | None = None  # the last size(): (nodes kept, expected tokens); None: none

    # -- calibration --------------------------------------------------------------------------------
    def acceptance(self, cell: Cell) -> float:
        """Measured conditional acceptance of ``cell`` (the prior while unobserved)."""
        reached = self._reached.get(cell, 0.0)
        return (self._accepted.get(cell, 0.0) + self.prior * PRIOR_WEIGHT) / (reached + PRIOR_WEIGHT)

    def path_acceptance(self, tree: DraftTree) -> list[float]:
        """P of each draft node (node i + 1 at index i): the chance its whole path is accepted."""
        scores = tree.scores
        parents = tree.parents.tolist()
        p = [1.0] * tree.num_nodes
        for i in range(1, tree.num_nodes):
            a = self.acceptance(cell_of(scores.source, scores.match_length, scores.conditional[i - 1]))
            p[i] = p[parents[i]] * a
        return p[1:]

    def observe(self, tree: DraftTree, accepted_path: list[int]) -> None:
        """One verified tree: ``accepted_path`` the accepted node indices (root excluded)."""
        scores = tree.scores
        if scores is None:
            return
        accepted = set(accepted_path)
        for i, parent in enumerate(tree.parents.tolist()):
            if i == 0 or (parent != 0 and parent not in accepted):
                continue  # the root, or a node verification never reached
            self.observe_node(cell_of(scores.source, scores.match_length, scores.conditional[i - 1]), i in accepted)

    def observe_node(self, cell: Cell, accepted: bool) -> None:
        """One verified node of ``cell`` whose parent was accepted (callers that hold chains, not trees: the
        proposer inside vLLM, hyspec.vllm.hybrid)."""
        keep = 1.0 - self.alpha
        self._reached[cell] = self._reached.get(cell, 0.0) * keep + 1.0
        self._accepted[cell] = self._accepted.get(cell, 0.0) * keep + accepted

    # -- the step's choice --------------------------------------------------------------------------
    def size(self, trees: Mapping[str, DraftTree], batch: int, spec_seconds: Callable[[float], float],
             plain_goodput: float) -> dict[str, DraftTree]:
        """The trees to verify (each cut to its kept nodes; a tree with none is left out).

        ``spec_seconds(n)``: predicted seconds of a step verifying ``n`` draft tokens over the batch;
        ``plain_goodput``: committed tokens per second a plain step must be beaten by."""
        ranked: list[tuple[float, int, int]] = []  # (-P, tree, node)
        order = list(trees)
        for t, rid in enumerate(order):
            tree = trees[rid]
            if tree.scores is None:
                continue
            ranked += [(-p, t, i) for i, p in enumerate(self.path_acceptance(tree), 1)]
        ranked.sort()
        best_n, best, expected, best_expected = 0, plain_goodput, float(batch), 0.0
        for n, (neg_p, _, _) in enumerate(ranked, 1):
            expected -= neg_p
            goodput = expected / spec_seconds(n)
            if goodput > best:
                best_n, best, best_expected = n, goodput, expected
        self.last_choice = (best_n, best_expected) if best_n else None
        if best_n == 0 and ranked:
            self.empty_streak += 1
            if self.explore_interval and self.empty_streak >= self.explore_interval:
                self.empty_streak = 0
                return dict(trees)  # probe: verify every draft whole
            return {}
        self.empty_streak = 0
        kept: dict[int, list[int]] = {}
        for _, t, i in ranked[:best_n]:
            kept.setdefault(t, []).append(i)
        out = {rid: tree for rid, tree in trees.items() if tree.scores is None}  # nothing to size them by
        for t, nodes in kept.items():
            tree = trees[order[t]]
            out[order[t]] = tree if len(nodes) == tree.num_nodes - 1 else tree.keep(nodes)
        return out
