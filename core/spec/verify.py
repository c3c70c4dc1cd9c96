"""Verification of draft trees: what the target keeps, and the token it adds.

Glossary (p = the target's processed distribution, q = the draft's):

* root — node 0, the last committed token; not a draft, never "accepted".
* accepted tokens — draft tokens on the accepted root-to-node path, in depth
  order.  They are emitted exactly as if the target had produced them.
* rejected position — the depth just below the last accepted node when that
  node has children: every child there was tried and refused.  Cause
  ``token_mismatch`` (greedy: none equals the argmax) or
  ``probability_rejected`` (stochastic: every acceptance test failed).
* recovered token — after a rejection, the token the target emits instead:
  the argmax (greedy) or a draw from the residual norm(max(0, p - q))
  (stochastic, see hyspec.ops.rejection).
* bonus token — when the accepted path ends at a leaf, one more token from the
  target's p after that leaf (the argmax at temperature 0), for free.
* sampled token — a tree with only its root: a plain target sample.
* emitted tokens — accepted tokens + the next token (recovered, bonus or
  sampled): 1 to max_depth + 1 tokens per sequence and step.

``verify`` handles a mixed batch in one call: temperature-0 rows go through
greedy matching (verify_greedy.py), the others through recursive rejection
sampling (the op ``rejection_sample``, reference in hyspec/ops/rejection.py, that
backends may replace).  p and q are always after temperature/top-k/top-p/min-p.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

import torch

from hyspec.errors import HyspecError
from hyspec.ops.rejection import rejection_sample
from hyspec.ops.sampling import SamplingTensors, draw_uniforms
from hyspec.seam.tree import TreeBatch
from hyspec.spec.verify_greedy import verify_greedy

if TYPE_CHECKING:
    from hyspec.ops import OpTable

# position_outcome values
ACCEPTED, REJECTED, NOT_TRIED = 1, 0, -1
# next_token_kind values
BONUS, RECOVERED, SAMPLED = 0, 1, 2
NEXT_TOKEN_KINDS = ("bonus", "recovered", "sampled")
GREEDY_CAUSE, STOCHASTIC_CAUSE = "token_mismatch", "probability_rejected"


@dataclass
class VerifyResult:
    """Per-sequence outcome of one verification step (D = the batch's max tree depth)."""

    accepted_nodes: torch.Tensor  # [B, D] int64, accepted path (depth order, root excluded), -1 padded
    accepted_tokens: torch.Tensor  # [B, D] int64, their tokens, -1 padded
    num_accepted: torch.Tensor  # [B] int64
    next_token: torch.Tensor  # [B] int64, always in [0, V)
    next_token_kind: torch.Tensor  # [B] int64: BONUS, RECOVERED or SAMPLED
    position_outcome: torch.Tensor  # [B, D] int8: ACCEPTED, REJECTED or NOT_TRIED per draft depth
    rejection_cause: list[str | None]  # per sequence; None when nothing was rejected
    last_node: torch.Tensor  # [B] int64, end of the accepted path (0 = the root): whose KV is kept last

    def emitted_tokens(self) -> list[list[int]]:
        """Host lists: accepted tokens then the next token, per sequence."""
        accepted = self.accepted_tokens.tolist()
        return [
            row[:n] + [t]
            for row, n, t in zip(accepted, self.num_accepted.tolist(), self.next_token.tolist())
        ]


def verify(
    target_logits: torch.Tensor,  # [T, V] packed: row trees.packed_index[b, i] = target logits after node i
    trees: TreeBatch,
    sampling: SamplingTensors,  # [B] rows, one per sequence
    generators: Sequence[torch.Generator | None] | None = None,  # [B]; None = default generator
    *,
    uniforms: torch.Tensor | None = None,  # [B, N] injected uniforms (tests); else drawn per request
    ops: "OpTable | None" = None,
) -> VerifyResult:
    """Verify every tree of the batch against the target in one call.

    A stochastic sequence ``b`` draws exactly ``trees.num_nodes[b]`` uniforms
    from ``generators[b]`` (none for greedy ones), so seeded results do not
    depend on the rest of the batch.
    """
    b, vocab = trees.batch_size, target_logits.shape[-1]
    _check_inputs(target_logits, trees, sampling, generators, uniforms)
    greedy_rows = [r for r in range(b) if sampling.is_greedy_host[r]]
    stochastic_rows = [r for r in range(b) if not sampling.is_greedy_host[r]]
    device = target_logits.device
    last = torch.zeros(b, dtype=torch.int64, device=device)
    next_token = torch.zeros(b, dtype=torch.int64, device=device)

    if greedy_rows:
        sub_trees, sub_logits = _subset(trees, target_logits, greedy_rows)
        sub_last, sub_next = verify_greedy(sub_logits, sub_trees)
        _put(last, greedy_rows, sub_last)
        _put(next_token, greedy_rows, sub_next)

    if stochastic_rows:
        sub_trees, sub_logits = _subset(trees, target_logits, stochastic_rows)
        sub_sampling = sampling if len(stochastic_rows) == b else sampling.select(stochastic_rows)
        probs = target_probs(sub_logits, sub_sampling, sub_trees)
        if uniforms is None:
            gens = [None] * b if generators is None else list(generators)
            sub_u = draw_uniforms([gens[r] for r in stochastic_rows], sub_trees.num_nodes_host, device)
        else:
            sub_u = uniforms[torch.as_tensor(stochastic_rows, device=uniforms.device), : sub_trees.max_nodes]
        sampler = rejection_sample if ops is None else ops.rejection_sample
        sub_last, sub_next = sampler(probs, sub_trees, sub_u)
        _put(last, stochastic_rows, sub_last)
        _put(next_token, stochastic_rows, sub_next)

    next_token.clamp_(0, vocab - 1)  # a backend's sampler must never hand out an invalid id
    causes = [GREEDY_CAUSE if g else STOCHASTIC_CAUSE for g in sampling.is_greedy_host]
    return build_result(trees, last, next_token, causes)


def target_probs(logits: torch.Tensor, sampling: SamplingTensors, trees: TreeBatch) -> torch.Tensor:  # [T, V]
    """The target's processed distribution after every node: each tree row gets its sequence's settings."""
    return sampling.repeat(trees.num_nodes).to(logits.device).process(logits)


def build_result(
    trees: TreeBatch,
    last: torch.Tensor,  # [B] int64, last accepted node (0 = only the root)
    next_token: torch.Tensor,  # [B] int64
    causes: Sequence[str],  # [B] cause to report if sequence b had a rejection
) -> VerifyResult:
    """Expand (last accepted node, next token) into paths, per-position outcomes and causes."""
    b, d = trees.batch_size, trees.max_depth
    device = trees.tokens.device
    rows = torch.arange(b, device=device)
    last = last.to(device)
    nodes = trees.path_nodes(last)  # [B, D]
    num_accepted = trees.depths[rows, last]
    tokens = torch.where(nodes >= 0, trees.tokens.gather(1, nodes.clamp(min=0)), -1)
    if trees.children.shape[2]:
        rejected = trees.children[rows, last, 0] >= 0  # last accepted node had children: all refused
    else:
        rejected = torch.zeros(b, dtype=torch.bool, device=device)
    kind = torch.where(rejected, RECOVERED, torch.where(trees.num_nodes == 1, SAMPLED, BONUS))
    pos = torch.arange(d, device=device)[None, :]
    outcome = torch.where(
        pos < num_accepted[:, None],
        ACCEPTED,
        torch.where((pos == num_accepted[:, None]) & rejected[:, None], REJECTED, NOT_TRIED),
    ).to(torch.int8)
    cause = [c if r else None for c, r in zip(causes, rejected.tolist())]
    return VerifyResult(nodes, tokens, num_accepted, next_token.to(device), kind.to(torch.int64), outcome, cause, last)


def _subset(trees: TreeBatch, logits: torch.Tensor, rows: list[int]) -> tuple[TreeBatch, torch.Tensor]:
    """The trees ``rows`` and their packed logits rows (identity for the whole batch)."""
    if len(rows) == trees.batch_size:
        return trees, logits
    idx = torch.as_tensor(rows, dtype=torch.int64, device=trees.tokens.device)
    packed = trees.packed_index[idx][trees.valid[idx]]
    return trees.select(idx), logits[packed.to(logits.device)]


def _put(dst: torch.Tensor, rows: list[int], values: torch.Tensor) -> None:
    if len(rows) == dst.shape[0]:
        dst.copy_(values)
    else:
        dst[torch.as_tensor(rows, dtype=torch.int64, device=dst.device)] = values.to(dst.device)


def _check_inputs(
    target_logits: torch.Tensor,
    trees: TreeBatch,
    sampling: SamplingTensors,
    generators: Sequence[torch.Generator | None] | None,
    uniforms: torch.Tensor | None,
) -> None:
    b = trees.batch_size
    if target_logits.dim() != 2 or target_logits.shape[0] != trees.num_tokens:
        raise HyspecError(
            f"verify: target_logits must be [T={trees.num_tokens}, V] (one row per tree node), "
            f"got {tuple(target_logits.shape)}"
        )
    if trees.tokens.device != target_logits.device:
        raise HyspecError(f"verify: the trees are on {trees.tokens.device} but the target's logits on "
                          f"{target_logits.device}; build the batch with TreeBatch.from_trees(..., device=)")
    vocab = target_logits.shape[1]
    if trees.vocab_size is not None and trees.vocab_size != vocab:
        raise HyspecError(f"verify: trees use vocab size {trees.vocab_size}, the target's logits have {vocab}")
    if trees.vocab_size is None and int(trees.tokens.max()) >= vocab:
        raise HyspecError(f"verify: a draft token is >= the target's vocab size {vocab}")
    if sampling.num_rows != b:
        raise HyspecError(f"verify: {sampling.num_rows} sampling rows for {b} trees")
    if generators is not None and len(generators) != b:
        raise HyspecError(f"verify: {len(generators)} generators for {b} trees")
    if uniforms is not None and (uniforms.dim() != 2 or uniforms.shape[0] != b or uniforms.shape[1] < trees.max_nodes):
        raise HyspecError(f"verify: uniforms must be [B={b}, N>={trees.max_nodes}], got {tuple(uniforms.shape)}")
