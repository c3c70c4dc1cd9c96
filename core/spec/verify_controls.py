"""A request's logits processors under speculation: every tree row gets the law plain decoding would
have sampled from there, and drafts through a forbidden token are cut before the target runs.

Row ``i`` of a tree is the target's logits after the committed output followed by the draft tokens
on node ``i``'s root path, so each processor is asked for every row with that path
(``hyspec.seam.processors``): a penalty counts the earlier drafts on the path, ``min_tokens`` counts
them as output, a grammar walks them.  Greedy matching and rejection sampling then both compare
against the processed law, which is what makes the controls lossless for every method.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import torch

from hyspec.seam.processors import allowed_prefix, apply_processors
from hyspec.seam.tree import DraftTree

if TYPE_CHECKING:
    from hyspec.seam.views import EngineSequenceView


def node_paths(tree: DraftTree) -> list[list[int]]:
    """Per node, the draft tokens from the root (excluded) down to it: ``[]`` for the root."""
    tokens, parents = tree.tokens.tolist(), tree.parents.tolist()
    paths: list[list[int]] = [[]]
    for i in range(1, len(tokens)):
        paths.append(paths[parents[i]] + [tokens[i]])  # parents[i] < i: the parent's path is built
    return paths


def apply_tree_processors(logits: torch.Tensor, seqs: Sequence["EngineSequenceView"],
                          trees: Sequence[DraftTree]) -> torch.Tensor:
    """``logits [T, V]`` (the trees' rows packed in order) with each request's processors applied to its
    rows: an fp32 copy, or ``logits`` itself when no request has processors."""
    if not any(s.processors for s in seqs):
        return logits
    out = logits.float().clone()
    start = 0
    for seq, tree in zip(seqs, trees):
        n = tree.num_nodes
        if seq.processors:
            apply_processors(seq.processors, node_paths(tree), out[start:start + n])
        start += n
    return out


def cut_forbidden_drafts(tree: DraftTree, seq: "EngineSequenceView") -> DraftTree:
    """``tree`` without the nodes whose path passes a token the request's processors forbid.

    Cutting a node changes which tokens are proposed, which is lossless when the proposal does not
    depend on chance: deterministic drafts (``draft_probs`` None: one-hot q) or a greedy request.  A
    token drawn from q would be cut only when it is forbidden, which conditions q: such trees are left
    whole, and verification refuses the forbidden draft itself (its target probability is 0)."""
    if not seq.processors or (tree.draft_probs is not None and not seq.params.greedy):
        return tree
    paths = node_paths(tree)
    keep = [i for i in range(1, tree.num_nodes) if allowed_prefix(seq.processors, paths[i]) == len(paths[i])]
    return tree if len(keep) == tree.num_nodes - 1 else tree.keep(keep)
