"""Greedy verification: exact cases on hand-built logits, and identity with plain argmax decoding."""
from __future__ import annotations

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hyspec.errors import HyspecError
from hyspec.ops.sampling import SamplingTensors
from hyspec.seam.tree import DraftTree, TreeBatch
from hyspec.spec.verify import ACCEPTED, BONUS, NOT_TRIED, RECOVERED, REJECTED, SAMPLED, verify

V = 10


def logits_for(trees: list[DraftTree], argmax: list[list[int]]) -> torch.Tensor:
    """Packed logits whose argmax after node i of tree b is argmax[b][i] (other logits random, lower)."""
    rows = []
    for tree, best in zip(trees, argmax):
        assert len(best) == tree.num_nodes
        for token in best:
            row = torch.rand(V)
            row[token] = 2.0
            rows.append(row)
    return torch.stack(rows)


def run(trees: list[DraftTree], argmax: list[list[int]]):
    batch = TreeBatch.from_trees(trees, vocab_size=V)
    greedy = SamplingTensors.from_lists([0.0] * len(trees))
    return verify(logits_for(trees, argmax), batch, greedy)


def test_chain_fully_accepted_gets_the_bonus_token():
    r = run([DraftTree.chain(0, [1, 2, 3])], [[1, 2, 3, 7]])
    assert r.emitted_tokens() == [[1, 2, 3, 7]]
    assert r.num_accepted.tolist() == [3] and r.accepted_nodes.tolist() == [[1, 2, 3]]
    assert r.next_token_kind.tolist() == [BONUS] and r.rejection_cause == [None]
    assert r.position_outcome.tolist() == [[ACCEPTED] * 3]
    assert r.last_node.tolist() == [3]


def test_first_draft_rejected():
    r = run([DraftTree.chain(0, [1, 2, 3])], [[4, 2, 3, 7]])
    assert r.emitted_tokens() == [[4]]
    assert r.next_token_kind.tolist() == [RECOVERED] and r.rejection_cause == ["token_mismatch"]
    assert r.position_outcome.tolist() == [[REJECTED, NOT_TRIED, NOT_TRIED]]
    assert r.last_node.tolist() == [0]


def test_rejection_in_the_middle_keeps_the_prefix():
    r = run([DraftTree.chain(0, [1, 2, 3])], [[1, 5, 3, 7]])
    assert r.emitted_tokens() == [[1, 5]]
    assert r.position_outcome.tolist() == [[ACCEPTED, REJECTED, NOT_TRIED]]


def test_later_sibling_is_tried_and_accepted():
    #      0
    #    /   \
    #   1(a)  2(b) - 3(c)
    tree = DraftTree.from_parents([0, 1, 2, 3], [-1, 0, 0, 2])
    r = run([tree], [[2, 9, 3, 8]])
    assert r.emitted_tokens() == [[2, 3, 8]]
    assert r.accepted_nodes.tolist() == [[2, 3]] and r.next_token_kind.tolist() == [BONUS]


def test_no_sibling_matches():
    tree = DraftTree.from_parents([0, 1, 2, 3], [-1, 0, 0, 2])
    r = run([tree], [[6, 9, 3, 8]])
    assert r.emitted_tokens() == [[6]] and r.rejection_cause == ["token_mismatch"]


def test_duplicate_siblings_take_the_longest_path():
    # Nodes 1 and 2 both hold token 4; only node 2 has a (matching) child.
    tree = DraftTree.from_parents([0, 4, 4, 5], [-1, 0, 0, 2])
    r = run([tree], [[4, 1, 5, 6]])
    assert r.accepted_nodes.tolist() == [[2, 3]] and r.emitted_tokens() == [[4, 5, 6]]
    # Equally deep matches: the lower index wins.
    tree = DraftTree.from_parents([0, 4, 4], [-1, 0, 0])
    r = run([tree], [[4, 1, 2]])
    assert r.accepted_nodes.tolist() == [[1]] and r.emitted_tokens() == [[4, 1]]


def test_root_only_tree_is_plain_greedy_decoding():
    r = run([DraftTree.chain(3, [])], [[8]])
    assert r.emitted_tokens() == [[8]] and r.next_token_kind.tolist() == [SAMPLED]
    assert r.position_outcome.shape == (1, 0) and r.rejection_cause == [None]


def test_ragged_batch():
    trees = [DraftTree.chain(0, [1, 2]), DraftTree.chain(0, []), DraftTree.from_parents([0, 1, 2], [-1, 0, 0])]
    r = run(trees, [[1, 2, 9], [5], [2, 0, 7]])
    assert r.emitted_tokens() == [[1, 2, 9], [5], [2, 7]]
    assert r.position_outcome.tolist() == [[1, 1], [-1, -1], [1, -1]]


def test_nan_logits_still_emit_valid_ids():
    batch = TreeBatch.from_trees([DraftTree.chain(0, [1, 2])], vocab_size=V)
    logits = torch.full((3, V), float("nan"))
    logits[0, 1] = 1.0  # only the root row has a finite entry
    r = verify(logits, batch, SamplingTensors.from_lists([0.0]))
    assert r.emitted_tokens() == [[1, 0]]  # the all-NaN row is uniform: argmax is id 0


def test_bad_inputs_are_named():
    batch = TreeBatch.from_trees([DraftTree.chain(0, [1, 2])], vocab_size=V)
    greedy = SamplingTensors.from_lists([0.0])
    with pytest.raises(HyspecError, match="one row per tree node"):
        verify(torch.zeros(2, V), batch, greedy)
    with pytest.raises(HyspecError, match="vocab size"):
        verify(torch.zeros(3, V + 1), batch, greedy)
    with pytest.raises(HyspecError, match="2 sampling rows for 1 trees"):
        verify(torch.zeros(3, V), batch, SamplingTensors.from_lists([0.0, 0.0]))
    with pytest.raises(HyspecError, match="draft token is >="):
        verify(torch.zeros(3, 2), TreeBatch.from_trees([DraftTree.chain(0, [1, 2])]), greedy)


# --- identity with plain decoding on random trees -------------------------------------------


class ToyTarget:
    """A deterministic 'model': logits after a token prefix, random but fixed per prefix."""

    def __init__(self, seed: int, vocab: int):
        self.seed, self.vocab = seed, vocab

    def logits(self, prefix: tuple[int, ...]) -> torch.Tensor:
        g = torch.Generator().manual_seed(hash((self.seed, prefix)) % 2**31)
        # Few distinct values: greedy paths are long enough to exercise acceptance.
        return torch.randint(0, 4, (self.vocab,), generator=g).float() + torch.rand(self.vocab, generator=g) * 0.1

    def greedy_decode(self, prefix: tuple[int, ...], n: int) -> list[int]:
        out = list(prefix)
        for _ in range(n):
            out.append(int(self.logits(tuple(out)).argmax()))
        return out[len(prefix):]


def random_tree(rng: random.Random, target: ToyTarget, size: int) -> tuple[DraftTree, list[tuple[int, ...]]]:
    """A tree whose drafts are often (not always) the target's argmax, with each node's prefix."""
    tokens, parents, prefixes = [0], [-1], [()]
    for i in range(1, size):
        parent = rng.randrange(i)
        best = int(target.logits(prefixes[parent]).argmax())
        token = best if rng.random() < 0.6 else rng.randrange(target.vocab)
        tokens.append(token)
        parents.append(parent)
        prefixes.append(prefixes[parent] + (token,))
    return DraftTree.from_parents(tokens, parents, vocab_size=target.vocab), prefixes


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10**6), sizes=st.lists(st.integers(1, 12), min_size=1, max_size=5))
def test_greedy_output_is_a_prefix_of_plain_decoding(seed, sizes):
    rng = random.Random(seed)
    target = ToyTarget(seed, vocab=6)
    trees, rows = [], []
    for size in sizes:
        tree, prefixes = random_tree(rng, target, size)
        trees.append(tree)
        rows += [target.logits(p) for p in prefixes]
    r = verify(torch.stack(rows), TreeBatch.from_trees(trees), SamplingTensors.from_lists([0.0] * len(trees)))
    for b, (tree, emitted) in enumerate(zip(trees, r.emitted_tokens())):
        assert emitted == target.greedy_decode((), len(emitted))
        # Longest: no root-to-node path of the tree matches plain decoding further.
        best = 0
        for path in tree.paths():
            toks = [int(tree.tokens[i]) for i in path[1:]]
            plain = target.greedy_decode((), len(toks))
            k = next((j for j, (a, c) in enumerate(zip(toks, plain)) if a != c), len(toks))
            best = max(best, k)
        assert int(r.num_accepted[b]) == best
