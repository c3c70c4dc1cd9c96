"""Greedy verification (temperature 0): keep the drafts the target's argmax agrees with.

At temperature 0 the target's output is a deterministic function of the
context: after node ``j`` it emits ``argmax(logits[j])``.  A draft node is
therefore correct iff its token equals the argmax at its parent and its parent
is correct.  The accepted path is the deepest node whose whole root path is
correct (lowest index among equally deep ones; only duplicate siblings can
tie), and the next token is the argmax there, so the emitted ids are exactly
plain decoding's.  This rule is only lossless at temperature 0: used on a
sampling request it would always emit the argmax (tests/test_verify_stats.py
shows the statistical test catching that misuse).
"""
from __future__ import annotations

import torch

from hyspec.ops.sampling import greedy
from hyspec.seam.tree import TreeBatch


def verify_greedy(
    target_logits: torch.Tensor,  # [T, V] packed: row trees.packed_index[b, i] = logits after node i
    trees: TreeBatch,
) -> tuple[torch.Tensor, torch.Tensor]:  # last accepted node [B], next token [B]
    """Longest root-to-node path on which every token equals the target argmax at its parent."""
    b, n = trees.batch_size, trees.max_nodes
    rows = torch.arange(b, device=trees.tokens.device)
    argmax = greedy(target_logits)  # [T]; guarded, so NaN rows still give an id in [0, V)
    argmax_at = argmax[trees.packed_index.clamp(min=0)]  # [B, N]
    parent_argmax = argmax_at.gather(1, trees.parents.clamp(min=0))
    matches = (trees.tokens == parent_argmax) & trees.valid
    matches[:, 0] = True  # the root is committed, not a draft
    # A node is reachable iff every ancestor-or-self matches.
    reachable = ~(trees.ancestors & ~matches[:, None, :]).any(dim=-1) & trees.valid
    idx = torch.arange(n, device=trees.tokens.device)
    score = torch.where(reachable, trees.depths * (n + 1) + (n - idx), -1)
    last = score.argmax(dim=1)
    return last, argmax_at[rows, last]
