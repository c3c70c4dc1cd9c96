"""Draft trees as fixed-shape tensors; a chain is a tree with one child per node.

Node 0 is the ROOT: the last committed token.  It was already sampled (it is
not a draft) but its KV is not cached yet, so the target forward runs over the
root and every draft node, and row ``i`` of the target's logits is its
next-token distribution after node ``i``.  Nodes are in topological order
(``parents[i] < i``) and siblings are tried in index order by the verifier.
Node ``i`` sits at RoPE position ``context_len + depths[i]``.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Sequence

import torch

from hyspec.errors import HyspecError


def _depths_and_ancestors(parents: torch.Tensor, valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Depth ``[B, N]`` and ancestor-or-self mask ``[B, N, N]`` of padded, topologically ordered trees."""
    if parents.device.type == "cpu":
        return _depths_and_ancestors_host(parents, valid)
    return _depths_and_ancestors_vectorized(parents, valid)


def _depths_and_ancestors_vectorized(parents: torch.Tensor, valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """On the trees' own device (no host copy of the parents): one step per node index, over the batch."""
    b, n = parents.shape
    rows = torch.arange(b, device=parents.device)
    depths = torch.zeros(b, n, dtype=torch.int64, device=parents.device)
    anc = torch.zeros(b, n, n, dtype=torch.bool, device=parents.device)
    anc[:, 0, 0] = True
    for i in range(1, n):  # one step per node index, vectorised over the batch
        par = parents[:, i].clamp(min=0)
        live = valid[:, i]
        depths[:, i] = torch.where(live, depths[rows, par] + 1, 0)
        anc[:, i] = anc[rows, par] & live[:, None]
        anc[:, i, i] = live
    return depths, anc


def _depths_and_ancestors_host(parents: torch.Tensor, valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """_depths_and_ancestors on host lists: the same tensors, without the per-node-index loop of small tensor
    ops, each of which costs more than the whole tree's arithmetic (a 25-node suffix tree: ~0.4 ms of them per
    step, twice a step)."""
    b, n = parents.shape
    depths, anc = _depths_and_ancestors_lists(parents.tolist(), valid.tolist(), n)
    return (torch.tensor(depths, dtype=torch.int64).view(b, n),
            torch.tensor(anc, dtype=torch.bool).view(b, n, n))


def _depths_and_ancestors_lists(parents: list[list[int]], valid: list[list[bool]],
                                n: int) -> tuple[list[list[int]], list[list[list[bool]]]]:
    depths, anc = [], []
    for par_row, live_row in zip(parents, valid):
        d_row, a_row = [0] * n, [[False] * n for _ in range(n)]
        a_row[0][0] = True
        for i in range(1, n):
            if not live_row[i]:
                continue
            p = max(par_row[i], 0)
            d_row[i] = d_row[p] + 1
            a_row[i] = a_row[p].copy()
            a_row[i][i] = True
        depths.append(d_row)
        anc.append(a_row)
    return depths, anc


@dataclass(frozen=True)
class NodeScores:
    """A drafter's own estimate of each draft node (what draft sizing calibrates, draft_sizing.py).

    ``conditional[i]`` is node ``i + 1``'s estimated chance of acceptance given its parent was accepted
    (suffix decoding: the share of matched occurrences that continued that way); ``source`` and
    ``match_length`` say where the draft came from (suffix: 0 the request's own tokens, 1 the cache of
    earlier responses; the matched suffix's length)."""

    conditional: tuple[float, ...]
    source: int = 0
    match_length: int = 0


@dataclass
class DraftTree:
    """One sequence's draft tree.

    ``draft_probs`` row ``i`` is the processed draft distribution q that node
    ``i``'s token was drawn from (row 0, the root's, is ignored).  ``None``
    means the drafts were chosen deterministically (argmax chains, top-k
    expansion): the verifier then treats each q as the one-hot of the token.
    """

    tokens: torch.Tensor  # [N] int64, tokens[0] = root token
    parents: torch.Tensor  # [N] int64, parents[0] = -1, parents[i] < i
    draft_probs: torch.Tensor | None = None  # [N, V] fp32, or None
    vocab_size: int | None = None
    scores: NodeScores | None = None  # the drafter's per-node estimates (scored drafters only)
    depths: torch.Tensor = field(init=False)  # [N] int64, root 0

    def __post_init__(self) -> None:
        self.tokens = torch.as_tensor(self.tokens, dtype=torch.int64)
        self.parents = torch.as_tensor(self.parents, dtype=torch.int64, device=self.tokens.device)
        if self.tokens.dim() != 1 or self.tokens.numel() == 0:
            raise HyspecError(f"DraftTree.tokens must be a non-empty 1-D tensor, got shape {tuple(self.tokens.shape)}")
        n = self.tokens.numel()
        if self.parents.shape != (n,):
            raise HyspecError(f"DraftTree.parents must have shape ({n},), got {tuple(self.parents.shape)}")
        if self.draft_probs is not None:
            if self.draft_probs.dim() != 2 or self.draft_probs.shape[0] != n or not self.draft_probs.is_floating_point():
                raise HyspecError(
                    f"DraftTree.draft_probs must be a float [{n}, V] tensor, got "
                    f"{self.draft_probs.dtype} {tuple(self.draft_probs.shape)}"
                )
            if self.vocab_size is not None and self.draft_probs.shape[1] != self.vocab_size:
                raise HyspecError(f"DraftTree.draft_probs has {self.draft_probs.shape[1]} columns, vocab_size is {self.vocab_size}")
            self.vocab_size = int(self.draft_probs.shape[1])
        if self.scores is not None and len(self.scores.conditional) != n - 1:
            raise HyspecError(f"DraftTree.scores has {len(self.scores.conditional)} entries for {n - 1} draft nodes")
        if self.tokens.device.type == "cpu":
            parents = self.parents.tolist()
            _check_structure_host([self.tokens.tolist()], [parents], [n], self.vocab_size, "DraftTree")
            depths = [0] * n
            for i in range(1, n):
                depths[i] = depths[parents[i]] + 1
            self.depths = torch.tensor(depths)
        else:
            _check_structure(self.tokens[None], self.parents[None], torch.tensor([n]), self.vocab_size, "DraftTree")
            valid = torch.ones(1, n, dtype=torch.bool, device=self.tokens.device)
            self.depths = _depths_and_ancestors(self.parents[None], valid)[0][0]

    @classmethod
    def chain(
        cls,
        root: int,
        tokens: Sequence[int] | torch.Tensor,
        draft_probs: torch.Tensor | None = None,  # [k, V]: q of each draft token, or None
        vocab_size: int | None = None,
    ) -> "DraftTree":
        """A chain ``root -> tokens[0] -> ... -> tokens[k-1]``."""
        drafts = torch.as_tensor(tokens, dtype=torch.int64).flatten()
        k = drafts.numel()
        if draft_probs is not None:
            if draft_probs.dim() != 2 or draft_probs.shape[0] != k:
                raise HyspecError(f"chain draft_probs must be [{k}, V], got {tuple(draft_probs.shape)}")
            draft_probs = torch.cat([draft_probs.new_zeros(1, draft_probs.shape[1]), draft_probs])
        return cls(
            tokens=torch.cat([torch.tensor([root], dtype=torch.int64), drafts]),
            parents=torch.arange(-1, k, dtype=torch.int64),
            draft_probs=draft_probs,
            vocab_size=vocab_size,
        )

    @classmethod
    def from_parents(
        cls,
        tokens: Sequence[int] | torch.Tensor,
        parents: Sequence[int] | torch.Tensor,
        draft_probs: torch.Tensor | None = None,
        vocab_size: int | None = None,
    ) -> "DraftTree":
        """A tree from node tokens (root first) and parent indices (``-1`` for the root)."""
        return cls(torch.as_tensor(tokens), torch.as_tensor(parents), draft_probs, vocab_size)

    @property
    def num_nodes(self) -> int:
        return int(self.tokens.numel())

    def keep(self, nodes: Sequence[int]) -> "DraftTree":
        """The tree of the root and ``nodes`` (draft node indices whose parents are the root or kept too), in
        their original order, parents renumbered."""
        kept = sorted(set(nodes) - {0})
        new_index = {0: 0, **{old: new for new, old in enumerate(kept, 1)}}
        parents = self.parents.tolist()
        if any(parents[i] not in new_index for i in kept):
            raise HyspecError("DraftTree.keep: a kept node's parent was dropped")
        rows = torch.tensor([0, *kept], dtype=torch.int64, device=self.tokens.device)
        scores = None
        if self.scores is not None:
            scores = NodeScores(tuple(self.scores.conditional[i - 1] for i in kept), self.scores.source,
                                self.scores.match_length)
        return DraftTree(self.tokens[rows], [-1, *(new_index[parents[i]] for i in kept)],
                         None if self.draft_probs is None else self.draft_probs[rows], self.vocab_size, scores)

    def ancestor_mask(self) -> torch.Tensor:  # [N, N] bool, [i, j] = j is i or an ancestor of i
        valid = torch.ones(1, self.num_nodes, dtype=torch.bool, device=self.tokens.device)
        return _depths_and_ancestors(self.parents[None], valid)[1][0]

    def paths(self) -> list[list[int]]:
        """Root-to-leaf node paths, leaves in index order."""
        parents = self.parents.tolist()
        has_child = {p for p in parents if p >= 0}
        out = []
        for leaf in range(self.num_nodes):
            if leaf in has_child:
                continue
            path = [leaf]
            while parents[path[-1]] >= 0:
                path.append(parents[path[-1]])
            out.append(path[::-1])
        return out


def _check_structure(
    tokens: torch.Tensor,  # [B, N]
    parents: torch.Tensor,  # [B, N]
    num_nodes: torch.Tensor,  # [B]
    vocab_size: int | None,
    what: str,
) -> None:
    """Topological parents and in-range tokens on the valid nodes (one host sync)."""
    n = tokens.shape[1]
    idx = torch.arange(n, device=tokens.device)
    valid = idx[None, :] < num_nodes.to(tokens.device)[:, None]
    bad_root = parents[:, 0] != -1
    bad_parent = valid[:, 1:] & ((parents[:, 1:] < 0) | (parents[:, 1:] >= idx[None, 1:]))
    bad_token = valid & ((tokens < 0) | (tokens >= (vocab_size if vocab_size is not None else 2**62)))
    flags = torch.stack([bad_root.any(), bad_parent.any(), bad_token.any()]).tolist()
    if flags[0]:
        raise HyspecError(f"{what}: the root's parent (parents[0]) must be -1")
    if flags[1]:
        b, i = (bad_parent.nonzero()[0] + torch.tensor([0, 1], device=tokens.device)).tolist()
        raise HyspecError(
            f"{what}: node {i} of tree {b} has parent {int(parents[b, i])}; parents must satisfy 0 <= parents[i] < i"
        )
    if flags[2]:
        b, i = bad_token.nonzero()[0].tolist()
        raise HyspecError(f"{what}: node {i} of tree {b} has token {int(tokens[b, i])}, outside [0, {vocab_size})")


def _check_structure_host(tokens: list[list[int]], parents: list[list[int]], sizes: list[int],
                          vocab_size: int | None, what: str) -> None:
    """_check_structure on host lists (tree r's real nodes: the first ``sizes[r]`` of its rows), with its errors in
    its order: a drafter builds a tree a row and a step, and the tensor version's dozen small ops cost ~60 us of
    each (a suffix step at batch 1 is ~7 ms)."""
    if any(row[0] != -1 for row in parents):
        raise HyspecError(f"{what}: the root's parent (parents[0]) must be -1")
    for r, (row, k) in enumerate(zip(parents, sizes)):
        for i in range(1, k):
            if not 0 <= row[i] < i:
                raise HyspecError(f"{what}: node {i} of tree {r} has parent {row[i]}; "
                                  "parents must satisfy 0 <= parents[i] < i")
    limit = vocab_size if vocab_size is not None else 2**62
    for r, (row, k) in enumerate(zip(tokens, sizes)):
        for i in range(k):
            if not 0 <= row[i] < limit:
                raise HyspecError(f"{what}: node {i} of tree {r} has token {row[i]}, outside [0, {vocab_size})")


#: up to this many padded nodes, a CPU TreeBatch derives its tensors from host lists.  Past it the lists' per-node
#: Python costs more than the tensor ops' fixed overhead saves: on a Zen 4 VM one 5-node tree took 0.05 ms from
#: lists against 0.13 with tensor ops, 8 trees of 25 nodes 0.62 against 0.66, 32 of 8 nodes about the same, and
#: 10,000 five-node trees (the conformance suite's batches) 0.56 s against 0.21 s
HOST_NODES = 256


@dataclass
class TreeBatch:
    """``B`` draft trees padded to ``N = max(num_nodes)`` nodes, plus derived index tensors.

    Padding nodes have token 0 and parent -1 and belong to no path.  When any
    tree carries draft probabilities, ``draft_probs`` holds a row for every
    node of every tree (one-hot rows for deterministic trees, which is exactly
    how the verifier treats them).  The packed per-node layout (sequence after
    sequence, nodes in index order) is the one the target forward and the
    attention op use.
    """

    tokens: torch.Tensor  # [B, N] int64
    parents: torch.Tensor  # [B, N] int64
    num_nodes: torch.Tensor  # [B] int64, >= 1
    draft_probs: torch.Tensor | None = None  # [B, N, V] fp32, or None (all deterministic)
    vocab_size: int | None = None
    # Derived in __post_init__:
    valid: torch.Tensor = field(init=False, repr=False)  # [B, N] bool, real (non-padding) nodes
    depths: torch.Tensor = field(init=False, repr=False)  # [B, N] int64
    ancestors: torch.Tensor = field(init=False, repr=False)  # [B, N, N] bool, ancestor-or-self
    children: torch.Tensor = field(init=False, repr=False)  # [B, N, C] int64, r-th child of a node or -1
    packed_index: torch.Tensor = field(init=False, repr=False)  # [B, N] int64, row in the packed layout or -1
    num_nodes_host: list[int] = field(init=False, repr=False)
    max_depth: int = field(init=False)

    def __post_init__(self) -> None:
        self.num_nodes = torch.as_tensor(self.num_nodes, dtype=torch.int64, device=self.tokens.device)
        if self.tokens.dim() != 2 or self.parents.shape != self.tokens.shape:
            raise HyspecError(
                f"TreeBatch: tokens and parents must both be [B, N], got {tuple(self.tokens.shape)} "
                f"and {tuple(self.parents.shape)}"
            )
        b = self.tokens.shape[0]
        if self.num_nodes.shape != (b,):
            raise HyspecError(f"TreeBatch: num_nodes must have shape ({b},), got {tuple(self.num_nodes.shape)}")
        self.num_nodes_host = self.num_nodes.tolist()
        if b and (min(self.num_nodes_host) < 1 or max(self.num_nodes_host) > self.tokens.shape[1]):
            raise HyspecError(f"TreeBatch: num_nodes must be in [1, {self.tokens.shape[1]}], got {self.num_nodes_host}")
        n = max(self.num_nodes_host, default=1)
        self.tokens, self.parents = self.tokens[:, :n].long(), self.parents[:, :n].long()
        if self.draft_probs is not None:
            if self.draft_probs.dim() != 3 or self.draft_probs.shape[:1] != (b,) or self.draft_probs.shape[1] < n:
                raise HyspecError(f"TreeBatch: draft_probs must be [B={b}, N={n}, V], got {tuple(self.draft_probs.shape)}")
            if self.vocab_size is not None and self.draft_probs.shape[2] != self.vocab_size:
                raise HyspecError(f"TreeBatch: draft_probs has vocab {self.draft_probs.shape[2]}, vocab_size is {self.vocab_size}")
            self.draft_probs = self.draft_probs[:, :n]
            self.vocab_size = int(self.draft_probs.shape[2])
        device = self.tokens.device
        if device.type == "cpu" and b * n <= HOST_NODES:
            self._derive_on_host(b, n)
            return
        idx = torch.arange(n, device=device)
        self.valid = idx[None, :] < self.num_nodes[:, None]
        self.tokens = self.tokens.masked_fill(~self.valid, 0)
        self.parents = self.parents.masked_fill(~self.valid, -1)
        _check_structure(self.tokens, self.parents, self.num_nodes, self.vocab_size, "TreeBatch")
        self.depths, self.ancestors = _depths_and_ancestors(self.parents, self.valid)
        self.children = _child_table(self.parents, self.valid)
        offsets = torch.cumsum(self.num_nodes, 0) - self.num_nodes
        self.packed_index = torch.where(self.valid, offsets[:, None] + idx[None, :], -1)
        self.max_depth = int(self.depths.max()) if b else 0

    def _derive_on_host(self, b: int, n: int) -> None:
        """__post_init__'s checks and derived tensors for a batch on the CPU, from host lists: the same values
        and errors (in _check_structure's order) as the tensor code, which spent ~150 us of small tensor ops
        on a one-tree batch, on every step that verifies (tests/test_tree.py compares the two)."""
        sizes = self.num_nodes_host
        valid = [[i < k for i in range(n)] for k in sizes]
        tokens = [row[:k] + [0] * (n - k) for row, k in zip(self.tokens.tolist(), sizes)]
        parents = [row[:k] + [-1] * (n - k) for row, k in zip(self.parents.tolist(), sizes)]
        _check_structure_host(tokens, parents, sizes, self.vocab_size, "TreeBatch")
        depths, anc = _depths_and_ancestors_lists(parents, valid, n)
        offsets = [0, *itertools.accumulate(sizes)][:b]
        self.tokens = torch.tensor(tokens, dtype=torch.int64).view(b, n)
        self.parents = torch.tensor(parents, dtype=torch.int64).view(b, n)
        self.valid = torch.tensor(valid, dtype=torch.bool).view(b, n)
        self.depths = torch.tensor(depths, dtype=torch.int64).view(b, n)
        self.ancestors = torch.tensor(anc, dtype=torch.bool).view(b, n, n)
        self.children = _child_table_lists(parents, valid, b, n)
        self.packed_index = torch.tensor([[o + i if i < k else -1 for i in range(n)] for o, k in zip(offsets, sizes)],
                                         dtype=torch.int64).view(b, n)
        self.max_depth = max((max(row) for row in depths), default=0)

    @classmethod
    def from_trees(cls, trees: Sequence[DraftTree], vocab_size: int | None = None,
                   device: torch.device | str | None = None) -> "TreeBatch":
        """Pad single trees into a batch (one-hot q rows for the deterministic ones if any tree has q).

        ``device``: where the batch lives (default: the first tree's).  Verification passes the target
        logits' device: host drafters (ngram, suffix) build their trees on the CPU, a GPU head on the GPU.
        """
        if not trees:
            raise HyspecError("TreeBatch.from_trees needs at least one tree")
        sizes = {t.vocab_size for t in trees if t.vocab_size is not None} | ({vocab_size} if vocab_size else set())
        if len(sizes) > 1:
            raise HyspecError(f"TreeBatch.from_trees: trees disagree on the vocabulary size: {sorted(sizes)}")
        vocab = sizes.pop() if sizes else None
        b, n = len(trees), max(t.num_nodes for t in trees)
        device = trees[0].tokens.device if device is None else torch.device(device)
        if device.type == "cpu":  # one tensor from host lists, not two slice copies a tree
            tokens = torch.tensor([t.tokens.tolist() + [0] * (n - t.num_nodes) for t in trees], dtype=torch.int64)
            parents = torch.tensor([t.parents.tolist() + [-1] * (n - t.num_nodes) for t in trees], dtype=torch.int64)
        else:
            tokens = torch.zeros(b, n, dtype=torch.int64, device=device)
            parents = torch.full((b, n), -1, dtype=torch.int64, device=device)
            for r, t in enumerate(trees):
                tokens[r, : t.num_nodes] = t.tokens
                parents[r, : t.num_nodes] = t.parents
        draft_probs = None
        if any(t.draft_probs is not None for t in trees):
            draft_probs = torch.zeros(b, n, vocab, dtype=torch.float32, device=device)
            for r, t in enumerate(trees):
                if t.draft_probs is not None:
                    draft_probs[r, : t.num_nodes] = t.draft_probs.float()
                else:
                    draft_probs[r, torch.arange(1, t.num_nodes, device=device), t.tokens[1:].to(device)] = 1.0
        num_nodes = torch.tensor([t.num_nodes for t in trees], dtype=torch.int64, device=device)
        return cls(tokens, parents, num_nodes, draft_probs, vocab)

    @property
    def batch_size(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def max_nodes(self) -> int:
        return int(self.tokens.shape[1])

    @property
    def num_tokens(self) -> int:
        """Rows of the packed layout (all real nodes of all trees)."""
        return sum(self.num_nodes_host)

    def query_start_loc(self) -> torch.Tensor:  # [B+1] int32, as AttentionMetadata wants
        zero = torch.zeros(1, dtype=torch.int64, device=self.tokens.device)
        return torch.cat([zero, torch.cumsum(self.num_nodes, 0)]).to(torch.int32)

    def packed_tokens(self) -> torch.Tensor:  # [T] int64
        return self.tokens[self.valid]

    def packed_tree_mask(self) -> torch.Tensor:  # [T, N] bool
        """Row t (a node) sees column k (k-th new token of its sequence) iff k is an ancestor-or-self."""
        return self.ancestors[self.valid]

    def positions(self, context_lens: torch.Tensor) -> torch.Tensor:  # [B] -> [T] int64
        """RoPE position of every node: its sequence's committed length plus its depth."""
        ctx = torch.as_tensor(context_lens, dtype=torch.int64, device=self.tokens.device)
        return (ctx[:, None] + self.depths)[self.valid]

    def path_nodes(self, last: torch.Tensor) -> torch.Tensor:  # [B] -> [B, max_depth] int64
        """Nodes from the root's child down to ``last[b]`` in depth order, ``-1`` padded."""
        b, n, d = self.batch_size, self.max_nodes, self.max_depth
        rows = torch.arange(b, device=self.tokens.device)
        on_path = self.ancestors[rows, last] & (torch.arange(n, device=self.tokens.device) > 0)
        out = torch.full((b, d + 1), -1, dtype=torch.int64, device=self.tokens.device)
        slot = torch.where(on_path, self.depths - 1, d)  # off-path nodes land in a spare column
        out.scatter_(1, slot, torch.where(on_path, torch.arange(n, device=self.tokens.device), -1).expand(b, n))
        return out[:, :d]

    def select(self, rows: torch.Tensor | Sequence[int]) -> "TreeBatch":
        """The sub-batch of trees ``rows`` (in that order)."""
        idx = torch.as_tensor(rows, dtype=torch.int64, device=self.tokens.device)
        probs = None if self.draft_probs is None else self.draft_probs[idx]
        return TreeBatch(self.tokens[idx], self.parents[idx], self.num_nodes[idx], probs, self.vocab_size)


def _child_table(parents: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:  # -> [B, N, C]
    """``children[b, i, r]``: the r-th child (in index order) of node i, or -1."""
    if parents.device.type != "cpu":
        return _child_table_vectorized(parents, valid)
    return _child_table_lists(parents.tolist(), valid.tolist(), *parents.shape)


def _child_table_lists(parents: list[list[int]], valid: list[list[bool]], b: int, n: int) -> torch.Tensor:
    """_child_table from host lists: a handful of small tensor ops cost more than the whole tree."""
    kids = [[[] for _ in range(n)] for _ in range(b)]
    for r, (par_row, live_row) in enumerate(zip(parents, valid)):
        for i in range(1, n):
            if live_row[i]:
                kids[r][max(par_row[i], 0)].append(i)
    c = max((len(k) for row in kids for k in row), default=0)
    if c == 0:
        return torch.empty(b, n, 0, dtype=torch.int64)
    return torch.tensor([[k + [-1] * (c - len(k)) for k in row] for row in kids], dtype=torch.int64)


def _child_table_vectorized(parents: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """_child_table on the trees' own device (no host copy of the parents)."""
    b, n = parents.shape
    idx = torch.arange(n, device=parents.device)
    is_child = valid & (idx[None, :] > 0)
    earlier_sibling = (parents[:, :, None] == parents[:, None, :]) & (idx[None, None, :] < idx[None, :, None])
    rank = (earlier_sibling & is_child[:, None, :]).sum(-1)  # [B, N]
    c = int(rank[is_child].max()) + 1 if bool(is_child.any()) else 0
    table = torch.full((b * n * max(c, 1),), -1, dtype=torch.int64, device=parents.device)
    bb = torch.arange(b, device=parents.device)[:, None].expand(b, n)
    flat = (bb * n + parents.clamp(min=0)) * max(c, 1) + rank
    table[flat[is_child]] = idx.expand(b, n)[is_child]
    return table.view(b, n, max(c, 1))[:, :, :c]
