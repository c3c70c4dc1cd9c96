"""EAGLE-2 dynamic trees: expansion, re-ranking, masks, and losslessness at temperature > 0.

The statistical test decodes 200,000 toy sequences speculatively with trees
built by :class:`DynamicTrees` from processed draft scores (the proposer's
``draft_logprobs``) and verified by ``hyspec.spec.verify.verify``.  Threshold
as in tests/test_verify_stats.py: an outcome of exact probability p fails when
``|freq - p| > 5 sqrt(p (1 - p) / n) + 1 / n`` (<= 0.0056 at n = 200,000, so a
1% shift is caught); a deliberately broken drafter (deterministic top-k children
reported with the q they were ranked by) is caught by the same check.
"""
from __future__ import annotations

import random

import pytest
import torch

from hyspec.drafters.eagle.tree import DynamicTrees, draft_logprobs
from hyspec.errors import HyspecError
from hyspec.ops.sampling import SamplingTensors, process_logits
from hyspec.seam.tree import DraftTree, TreeBatch
from hyspec.spec.verify import verify

# -- expansion and re-ranking -----------------------------------------------------------------


def _lp(*probs: float) -> torch.Tensor:
    return torch.tensor(probs).log()


def test_hand_worked_tree():
    """k=2, depth 2, budget 4: level 1 = {0: .5, 1: .25}; 0 -> {2: .6, 3: .4}, 1 -> {4: .9, 5: .1}."""
    trees = DynamicTrees(roots=[7], budgets=[4], topk=2, depth=2)
    trees.grow(_lp(.5, .25, .1, .08, .05, .02)[None, None])
    assert trees.frontier_tokens(1).tolist() == [[0, 1]]
    level2 = torch.full((1, 2, 6), 1e-6)
    level2[0, 0, 2], level2[0, 0, 3] = .6, .4
    level2[0, 1, 4], level2[0, 1, 5] = .9, .1
    trees.grow(level2.log())
    # cumulative: 0->2 .30, 0->3 .20, 1->4 .225, 1->5 .025: the frontier is the best two
    assert sorted(trees.frontier_tokens(2).tolist()[0]) == [2, 4]
    assert trees.done
    # kept: .5 (0), .3 (0->2), .25 (1), .225 (1->4); level order, parents first
    assert trees.select() == [([7, 0, 1, 2, 4], [-1, 0, 0, 1, 2])]


def test_draft_to_target_mapping_applies_to_every_level():
    d2t = torch.tensor([10, 10, 10, 10])  # draft id d -> target id d + 10
    trees = DynamicTrees([3], [3], topk=1, depth=3)
    for _ in range(3):
        f = 1
        trees.grow(_lp(.1, .7, .1, .1).view(1, f, 4), lambda ids: ids + d2t[ids])
    assert trees.select() == [([3, 11, 11, 11], [-1, 0, 1, 2])]


@pytest.mark.parametrize("seed", range(12))
def test_random_trees_are_valid_and_keep_the_best_nodes(seed):
    """Ties (coarse log-probabilities), -inf entries and per-sequence budgets included."""
    rng = random.Random(seed)
    g = torch.Generator().manual_seed(seed)
    b, vocab = 3, 9
    topk, depth = rng.randint(1, 4), rng.randint(1, 4)
    budgets = [rng.randint(1, 12) for _ in range(b)]
    trees = DynamicTrees([1, 2, 3], budgets, topk, depth)

    def level_logprobs(f: int) -> torch.Tensor:
        logits = torch.randint(0, 4, (b, f, vocab), generator=g).float()  # many exact ties
        lp = torch.log_softmax(logits, dim=-1)
        return lp.masked_fill(torch.rand(b, f, vocab, generator=g) < 0.2, float("-inf"))

    trees.grow(level_logprobs(1))
    while not trees.done:
        trees.grow(level_logprobs(trees.k))
    scores = torch.cat(trees.scores, dim=1)
    for row, ((tokens, parents), budget) in enumerate(zip(trees.select(), budgets)):
        tree = DraftTree.from_parents(tokens, parents)  # validates: root first, parents[i] < i
        assert tree.num_nodes - 1 <= budget
        assert int(tree.depths.max()) <= min(depth, max(budgets))
        for p in set(parents[1:]):  # siblings are distinct tokens
            kids = [tokens[i] for i in range(1, len(tokens)) if parents[i] == p]
            assert len(kids) == len(set(kids))
        finite = scores[row][torch.isfinite(scores[row])].sort(descending=True).values
        n_kept = min(budget, finite.numel())
        assert tree.num_nodes - 1 == n_kept  # as many as the budget allows


def _path_logprobs(path: tuple[int, ...], vocab: int = 20) -> torch.Tensor:
    """A fixed random next-token log-distribution for every path from the root."""
    seed = 1 + hash(path) % (2**31)
    return torch.log_softmax(torch.randn(vocab, generator=torch.Generator().manual_seed(seed)) * 3, -1)


def _reference_tree(k: int, depth: int, budget: int) -> set[tuple[int, ...]]:
    """EAGLE-2 written out per node: expand the k best of each level, keep the best `budget` overall."""
    candidates, frontier = [], [((), 0.0)]
    for d in range(1, depth + 1):
        level = []
        for path, score in frontier:
            values, ids = _path_logprobs(path).topk(k)
            level += [(path + (t,), score + v) for v, t in zip(values.tolist(), ids.tolist())]
        candidates += [(-s, d, i, p) for i, (p, s) in enumerate(level)]
        frontier = sorted(level, key=lambda c: -c[1])[:k]
    return {c[3] for c in sorted(candidates)[:budget]}


@pytest.mark.parametrize("k, depth, budget", [(2, 3, 5), (3, 4, 10), (4, 2, 7), (1, 5, 3)])
def test_kept_nodes_match_a_per_node_reference(k, depth, budget):
    trees = DynamicTrees([0], [budget], topk=k, depth=depth)
    paths = [()]
    trees.grow(_path_logprobs(())[None, None])
    while not trees.done:
        level = trees.levels
        parents = [-1] * k if level == 1 else trees.frontier_parent_slots(level)[0].tolist()
        previous = paths if level > 1 else [()] * k
        paths = [previous[max(p, 0)] + (t,) for p, t in zip(parents, trees.frontier_tokens(level)[0].tolist())]
        trees.grow(torch.stack([_path_logprobs(p) for p in paths])[None])
    (tokens, parents), = trees.select()
    got = set()
    for i in range(1, len(tokens)):
        path, j = [], i
        while j > 0:
            path.append(tokens[j])
            j = parents[j]
        got.add(tuple(reversed(path)))
    assert got == _reference_tree(k, depth, budget)


def test_fed_nodes_mask_matches_the_tree_ancestors():
    g = torch.Generator().manual_seed(3)
    trees = DynamicTrees([0, 0], [20, 20], topk=3, depth=4)
    trees.grow(torch.log_softmax(torch.randn(2, 1, 12, generator=g), -1))
    for _ in range(2):
        trees.grow(torch.log_softmax(torch.randn(2, 3, 12, generator=g), -1))
    tokens, depths, mask = trees.fed_nodes()
    assert tokens.shape == (2, 9) and depths[0].tolist() == [1, 1, 1, 2, 2, 2, 3, 3, 3]
    for b in range(2):
        parents = [-1] + [0] * 3
        for level in (2, 3):
            parents += [(level - 2) * 3 + 1 + s for s in trees.frontier_parent_slots(level)[b].tolist()]
        expected = DraftTree.from_parents([0] + tokens[b].tolist(), parents).ancestor_mask()[1:, 1:]
        assert torch.equal(mask[b], expected)


def test_bad_arguments_are_rejected():
    with pytest.raises(HyspecError, match="budgets"):
        DynamicTrees([1], [0], 2, 2)
    trees = DynamicTrees([1], [4], 2, 1)
    with pytest.raises(HyspecError, match=r"\[1, 1, V\]"):
        trees.grow(torch.zeros(1, 2, 5))
    trees.grow(torch.zeros(1, 1, 5))
    with pytest.raises(HyspecError, match="deep"):
        trees.grow(torch.zeros(1, 2, 5))


def test_greedy_rows_rank_by_log_softmax_and_sampled_rows_by_processed_q():
    logits = torch.tensor([[3.0, 2.0, 1.0, 0.0], [3.0, 2.0, 1.0, 0.0]])
    sampling = SamplingTensors.from_lists([0.0, 0.5], top_k=[None, 2])
    lp = draft_logprobs(logits, sampling)
    assert torch.allclose(lp[0], torch.log_softmax(logits[0], -1))
    q = process_logits(logits[1:], torch.tensor([0.5]), torch.tensor([2]), torch.ones(1), torch.zeros(1))[0]
    assert torch.allclose(lp[1, :2], q[:2].log()) and torch.isinf(lp[1, 2:]).all()
    assert torch.equal(draft_logprobs(logits, None), torch.log_softmax(logits, -1))


# -- losslessness at temperature > 0 -----------------------------------------------------------

VOCAB, LEVELS, BOS, NUM_SEQS = 16, 8, 0, 200_000
PARAMS = dict(temperature=0.8, top_k=10, top_p=0.9, min_p=0.0)
BUDGET, TOPK, DEPTH = 7, 3, 3


class Toy:
    """Target and draft next-token logits ``[position, previous token, vocab]``."""

    def __init__(self, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        self.target = torch.randn(LEVELS, VOCAB, VOCAB, generator=g) * 1.5
        self.draft = self.target + torch.randn(LEVELS, VOCAB, VOCAB, generator=g)
        rows = self.target.reshape(-1, VOCAB)
        n = rows.shape[0]
        self.p = process_logits(rows, torch.full((n,), PARAMS["temperature"]),
                                torch.full((n,), PARAMS["top_k"]), torch.full((n,), PARAMS["top_p"]),
                                torch.zeros(n)).view(LEVELS, VOCAB, VOCAB).double()
        self.q = process_logits(self.draft.reshape(-1, VOCAB), torch.full((n,), PARAMS["temperature"]),
                                torch.full((n,), PARAMS["top_k"]), torch.full((n,), PARAMS["top_p"]),
                                torch.zeros(n)).view(LEVELS, VOCAB, VOCAB)

    def exact(self) -> dict[str, torch.Tensor]:
        joint = self.p[0, BOS][:, None] * self.p[1]
        return {"y1": self.p[0, BOS], "y2": joint.sum(0), "y1y2": joint.flatten()}


def _sampling(n: int) -> SamplingTensors:
    return SamplingTensors.from_lists([PARAMS["temperature"]] * n, [PARAMS["top_k"]] * n, [PARAMS["top_p"]] * n)


def eagle_trees(toy: Toy, positions: list[int], roots: list[int]) -> list[tuple[list[int], list[int]]]:
    """The proposer's recipe on the toy drafter: processed scores, top-k expansion, re-ranking."""
    b = len(roots)
    trees = DynamicTrees(roots, [BUDGET] * b, TOPK, DEPTH)
    pos = torch.tensor(positions)
    trees.grow(draft_logprobs(toy.draft[pos, torch.tensor(roots)], _sampling(b))[:, None])
    while not trees.done:
        level = trees.levels
        tokens = trees.frontier_tokens(level)  # [B, k]: a node at depth `level` drafts position pos + level
        logits = toy.draft[(pos + level)[:, None].expand_as(tokens), tokens].reshape(-1, VOCAB)
        trees.grow(draft_logprobs(logits, _sampling(logits.shape[0])).view(b, trees.k, VOCAB))
    return trees.select()


def decode(toy: Toy, length: int, broken: bool = False, seed: int = 1,
           num_seqs: int = NUM_SEQS) -> torch.Tensor:  # [num_seqs, length]
    """Speculative decoding of ``num_seqs`` toy sequences, all trees of a step verified in one call."""
    g = torch.Generator().manual_seed(seed)
    out = torch.full((num_seqs, length + DEPTH + 1), -1, dtype=torch.int64)
    count = torch.zeros(num_seqs, dtype=torch.int64)
    last = torch.full((num_seqs,), BOS, dtype=torch.int64)
    while bool((count < length).any()):
        active = (count < length).nonzero().squeeze(1)
        m, pos = active.numel(), count[active]
        keys = (pos * VOCAB + last[active]).tolist()  # one deterministic tree per (position, last token)
        uniq = sorted(set(keys))
        built = eagle_trees(toy, [u // VOCAB for u in uniq], [u % VOCAB for u in uniq])
        width = max(len(t) for t, _ in built)
        table_t = torch.zeros(len(uniq), width, dtype=torch.int64)
        table_p = torch.full((len(uniq), width), -1, dtype=torch.int64)
        for r, (t, p) in enumerate(built):
            table_t[r, :len(t)], table_p[r, :len(p)] = torch.tensor(t), torch.tensor(p)
        index = {key: r for r, key in enumerate(uniq)}
        row = torch.tensor([index[key] for key in keys])
        tokens, parents = table_t[row], table_p[row]
        sizes = torch.tensor([len(t) for t, _ in built])[row]
        draft_probs = None
        if broken:  # deterministic top-k children reported as if drawn from q: the verifier then over-accepts
            shape = TreeBatch(tokens, parents, sizes, None, VOCAB)
            par = shape.parents.clamp(min=0)
            par_pos = pos[:, None] + shape.depths.gather(1, par)
            draft_probs = toy.q[par_pos, tokens.gather(1, par)] * shape.valid[..., None]
        batch = TreeBatch(tokens, parents, sizes, draft_probs, VOCAB)
        depth = batch.depths
        node_pos = (pos[:, None] + depth)[batch.valid]
        logits = toy.target[node_pos, batch.tokens[batch.valid]]  # [T, V] packed
        uniforms = torch.rand(m, batch.max_nodes, generator=g, dtype=torch.float64)
        result = verify(logits, batch, _sampling(m), uniforms=uniforms)
        emitted = torch.cat([result.accepted_tokens, torch.full((m, 1), -1)], dim=1)
        emitted[torch.arange(m), result.num_accepted] = result.next_token
        cols = count[active, None] + torch.arange(emitted.shape[1])[None, :]
        out[active[:, None].expand_as(cols), cols] = torch.where(emitted >= 0, emitted, out[active[:, None], cols])
        count[active] += result.num_accepted + 1
        last[active] = result.next_token
    return out[:, :length]


def failures(samples: torch.Tensor, exact: dict[str, torch.Tensor]) -> list[str]:
    n = samples.shape[0]
    observed = {"y1": samples[:, 0]}
    if samples.shape[1] > 1:
        observed.update({"y2": samples[:, 1], "y1y2": samples[:, 0] * VOCAB + samples[:, 1]})
    bad = []
    for name, obs in observed.items():
        p = exact[name]
        freq = torch.bincount(obs, minlength=p.numel()).double() / n
        threshold = torch.where(p > 0, 5 * (p * (1 - p) / n).sqrt() + 1.0 / n, 0.0)
        for k in ((freq - p).abs() > threshold).nonzero().flatten().tolist():
            bad.append(f"{name}={k}: freq {freq[k]:.5f} vs p {p[k]:.5f} (threshold {threshold[k]:.5f})")
    return bad


@pytest.fixture(scope="module")
def toy() -> Toy:
    return Toy()


@pytest.fixture(scope="module")
def samples(toy) -> torch.Tensor:
    return decode(toy, length=2)


def test_eagle_trees_at_temperature_emit_the_target_distribution(toy, samples):
    assert failures(samples, toy.exact()) == []
    # The trees were really used: deep paths were accepted in the first step.
    first = eagle_trees(toy, [0], [BOS])[0]
    assert len(first[0]) == BUDGET + 1 and max(DraftTree.from_parents(*first).depths.tolist()) == DEPTH


def test_the_check_catches_top_k_children_reported_with_their_q(toy):
    samples = decode(toy, length=1, broken=True, seed=4, num_seqs=20_000)  # a gross bias: few samples do
    assert failures(samples, toy.exact())


def test_the_check_detects_a_one_percent_shift(toy, samples):
    joint = toy.exact()["y1y2"].clone()
    a, b = joint.topk(2).indices.tolist()
    joint[a] -= 0.01
    joint[b] += 0.01
    assert failures(samples, {"y1y2": joint, "y1": toy.exact()["y1"], "y2": toy.exact()["y2"]})
