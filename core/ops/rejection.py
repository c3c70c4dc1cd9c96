"""The reference ``rejection_sample`` op: lossless rejection sampling over draft trees (temperature > 0).

Names as in the papers: p = the target's processed next-token distribution,
q = the draft distribution a draft token was drawn from (both after
temperature / top-k / top-p / min-p, see hyspec.ops.sampling).

Chains (Leviathan et al. 2023; Chen et al. 2023).  Draft x ~ q.  Accept x with
probability min(1, p(x)/q(x)); on rejection emit y ~ norm(max(0, p - q)).
Then P(emit y) = q(y) min(1, p(y)/q(y)) + (1 - sum_x min(q(x), p(x))) *
max(0, p(y) - q(y)) / sum_x max(0, p(x) - q(x)) = min(p, q)(y) + max(0, p - q)(y)
= p(y), because 1 - sum min(p, q) = sum max(0, p - q).  After an accepted x the
next node is verified against the target's distribution after x, so by the
chain rule the emitted sequence is distributed as the target's.  When every
draft on the path is accepted the bonus token is drawn from p at the last node.

Trees: multi-draft recursive rejection sampling (SpecInfer, Miao et al. 2024).
At a node whose children x_1..x_m are tried in order, with x_i drawn from q_i:

    p_0 = p
    for i = 1..m:   accept x_i with probability min(1, p_{i-1}(x_i) / q_i(x_i))
                    -> descend into x_i (its p is the target's after x_i)
                    else p_i = norm(max(0, p_{i-1} - q_i))
    none accepted:  emit y ~ p_m   (the "recovered" token)

Why this is lossless.  Condition on everything seen before child i (earlier
siblings' tokens and their rejections).  If x_i is then distributed as q_i, the
step "accept x_i or fall through to something distributed as p_i" is exactly
the chain step above with target p_{i-1}: it emits a token distributed as
p_{i-1}.  The fall-through after the last child emits p_m directly, so by
induction from the last child back to the first the node emits p_0 = p.  The
only requirement is on how siblings are drawn: each x_i must be drawn from the
q_i stored for it *given the earlier siblings*, independently of the target and
of the acceptance coins.  That covers
  * i.i.d. siblings, sampled with replacement from the parent's q (q_i = q;
    duplicates are allowed and harmless),
  * siblings sampled without replacement, if q_i is stored as q with the earlier
    siblings removed and renormalised,
  * deterministic distinct tokens (top-k expansion as in EAGLE-2, argmax
    chains, n-gram lookups): q_i = one-hot(x_i), the acceptance probability is
    min(1, p_{i-1}(x_i)) = p_{i-1}(x_i) and max(0, p_{i-1} - q_i) is p_{i-1} with
    x_i zeroed: "accept with p(x), else zero p(x) and renormalise".
It does NOT cover siblings sampled without replacement but stored with the
unconditioned q (the residual then over-corrects), nor any q other than the one
the token was really drawn from (e.g. q taken before top-p).

Randomness: one uniform per event, injected as ``uniforms[b, i]``: node i >= 1
is accepted iff u[b, i] * q(x_i) < p_cur(x_i) (no division, so q(x) = 0 is
safe), and u[b, 0] draws the final token by inverse CDF.  A node is tested at
most once, so the coins are independent.
"""
from __future__ import annotations

from typing import Protocol

import torch

from hyspec.ops.sampling import sample_from_uniforms

#: Residual mass below this is rounding noise, not a distribution.
_TINY = 1e-30


class DraftTrees(Protocol):
    """What the sampler reads of a batch of draft trees: the speculative layer's ``TreeBatch`` is one.

    Stated here as a protocol so that the op layer does not import the layer above it (seam/tree.py).
    """

    tokens: torch.Tensor  # [B, N] int64 draft token of every node (node 0 = the root)
    draft_probs: torch.Tensor | None  # [B, N, V] q each node was drawn from, or None (one-hot q everywhere)
    children: torch.Tensor  # [B, N, C] int64, r-th child of a node or -1
    packed_index: torch.Tensor  # [B, N] int64, row of a node in the packed target layout, -1 for padding
    max_depth: int

    @property
    def batch_size(self) -> int: ...


def rejection_sample(
    target_probs: torch.Tensor,  # [T, V] fp32: processed p after every node (rows sum to 1), packed like trees
    trees: DraftTrees,
    uniforms: torch.Tensor,  # [B, N] in [0, 1): u[:, 0] final sample, u[:, i] the test of node i
) -> tuple[torch.Tensor, torch.Tensor]:  # last accepted node [B], next token [B]
    """Recursive rejection sampling over every tree of the batch (reference version).

    Loops over depth levels and sibling ranks (at most N iterations together),
    each a tensor op over the sequences still trying; never over tokens.  The
    residual p_cur is kept unnormalised with its mass beside it, so a one-hot
    (deterministic) rejection costs O(1) per sequence instead of O(V).
    """
    b = trees.batch_size
    device = target_probs.device
    rows = torch.arange(b, device=device)
    u = uniforms.to(device=device, dtype=torch.float64)
    q_all = trees.draft_probs  # [B, N, V] or None (one-hot q everywhere)
    cur = torch.zeros(b, dtype=torch.int64, device=device)
    p_cur = target_probs[trees.packed_index[:, 0]].float()  # [B, V], a fresh copy we may edit
    mass = p_cur.double().sum(dim=1)  # [B], p_cur's total: the residual is p_cur / mass
    live = torch.ones(b, dtype=torch.bool, device=device)

    for _ in range(trees.max_depth):
        chosen = torch.full((b,), -1, dtype=torch.int64, device=device)
        for rank in range(trees.children.shape[2]):
            child = trees.children[rows, cur, rank]  # [B], -1 where no such child
            idx = (live & (chosen < 0) & (child >= 0)).nonzero().squeeze(1)  # sequences trying
            if idx.numel() == 0:
                break
            c = child[idx]
            x = trees.tokens[idx, c]
            p_x = p_cur[idx, x].double()
            if q_all is None:
                q_x = torch.ones_like(p_x)
            else:
                q_rows = q_all[idx, c].float()  # [I, V]
                q_x = q_rows.gather(1, x[:, None]).squeeze(1).double()
            # Accept with min(1, (p_cur(x) / mass) / q(x)); no division, so q(x) = 0 is safe.
            accept = u[idx, c] * q_x * mass[idx] < p_x
            chosen[idx[accept]] = c[accept]
            rej = ~accept
            if not bool(rej.any()):
                continue
            r_idx = idx[rej]
            if q_all is None:
                # max(0, p_cur - onehot(x)) is p_cur with x zeroed.  A one-hot rejection
                # needs p_cur(x) < mass, so some mass always remains.
                p_cur[r_idx, x[rej]] = 0.0
                mass[r_idx] -= p_x[rej]
            else:
                residual = (p_cur[r_idx] - mass[r_idx, None].float() * q_rows[rej]).clamp_min(0.0)
                new_mass = residual.double().sum(dim=1)
                # Zero residual mass means p_cur <= q everywhere, i.e. p_cur == q, where
                # rejection has probability 0 and only rounding gets here: keep p_cur.
                ok = new_mass > _TINY
                p_cur[r_idx[ok]] = residual[ok]
                mass[r_idx[ok]] = new_mass[ok]
        moved = (chosen >= 0).nonzero().squeeze(1)
        live = chosen >= 0
        if moved.numel() == 0:
            break
        # Descend: the next level is verified against the target's p after the accepted node.
        cur[moved] = chosen[moved]
        p_cur[moved] = target_probs[trees.packed_index[moved, cur[moved]]].float()
        mass[moved] = p_cur[moved].double().sum(dim=1)

    # Bonus token (a leaf was reached: p_cur is p there) or recovered token (every
    # child of cur rejected: p_cur is the last residual).  Inverse-CDF sampling
    # normalises by the row's total itself.
    return cur, sample_from_uniforms(p_cur, u[:, 0])
