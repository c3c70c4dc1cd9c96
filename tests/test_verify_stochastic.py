"""Stochastic verification: exact cases with injected uniforms, seeding, guards, mixed batches, the op seam."""
from __future__ import annotations

import math

import pytest
import torch

from hyspec.ops import reference_ops
from hyspec.ops.sampling import SamplingTensors
from hyspec.seam.tree import DraftTree, TreeBatch
from hyspec.spec.verify import BONUS, RECOVERED, REJECTED, SAMPLED, verify
from hyspec.spec.verify_greedy import verify_greedy

LOG = math.log


def logits_of(*dists: list[float]) -> torch.Tensor:
    """Logits whose softmax at temperature 1 is each given distribution (zeros -> -inf)."""
    return torch.tensor([[LOG(x) if x > 0 else -math.inf for x in d] for d in dists])


def one(temperature: float = 1.0, n: int = 1) -> SamplingTensors:
    return SamplingTensors.from_lists([temperature] * n)


P_ROOT = [0.3, 0.5, 0.2]
P_AFTER = [0.1, 0.1, 0.8]
Q = [0.6, 0.2, 0.2]


@pytest.mark.parametrize(
    "u_accept, u_final, emitted, kind",
    [
        # p(0)/q(0) = 0.5: u < 0.5 accepts token 0, then the bonus is drawn from P_AFTER.
        (0.49, 0.05, [0, 0], BONUS),
        (0.49, 0.95, [0, 2], BONUS),
        # Rejected: residual norm(max(0, p - q)) = [0, 0.3, 0] / 0.3 = token 1 whatever u_final.
        (0.51, 0.01, [1], RECOVERED),
        (0.51, 0.99, [1], RECOVERED),
    ],
)
def test_chain_step_with_injected_uniforms(u_accept, u_final, emitted, kind):
    tree = DraftTree.chain(2, [0], draft_probs=torch.tensor([Q]))
    r = verify(logits_of(P_ROOT, P_AFTER), TreeBatch.from_trees([tree]), one(), uniforms=torch.tensor([[u_final, u_accept]]))
    assert r.emitted_tokens() == [emitted] and r.next_token_kind.tolist() == [kind]
    if kind == RECOVERED:
        assert r.rejection_cause == ["probability_rejected"] and r.position_outcome.tolist() == [[REJECTED]]


def test_deterministic_siblings_zero_the_rejected_token():
    """EAGLE-2 rule: accept x with p_cur(x), else zero it and renormalise, for each sibling in turn."""
    tree = DraftTree.from_parents([2, 1, 0], [-1, 0, 0])  # siblings try token 1, then token 0
    batch = TreeBatch.from_trees([tree])
    logits = logits_of(P_ROOT, P_AFTER, P_AFTER)
    # Token 1 accepted iff u1 < 0.5.  After rejecting it p_cur = [0.6, 0, 0.4]: token 0 iff u2 < 0.6;
    # then [0, 0, 1].  Bonus tokens come from P_AFTER (CDF 0.1, 0.2, 1): u0 = 0.3 gives token 2.
    cases = [((0.3, 0.4, 0.99), [1, 2]), ((0.3, 0.6, 0.59), [0, 2]), ((0.3, 0.6, 0.61), [2])]
    for (u0, u1, u2), emitted in cases:
        r = verify(logits, batch, one(), uniforms=torch.tensor([[u0, u1, u2]]))
        assert r.emitted_tokens() == [emitted], (u0, u1, u2)


def test_root_only_tree_is_a_plain_sample_from_the_generator():
    batch = TreeBatch.from_trees([DraftTree.chain(0, [], vocab_size=3)])
    g1, g2 = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    r = verify(logits_of(P_ROOT), batch, one(), [g1])
    u = torch.rand(1, generator=g2, dtype=torch.float64).item()
    expected = 0 if u < 0.3 else 1 if u < 0.8 else 2
    assert r.emitted_tokens() == [[expected]] and r.next_token_kind.tolist() == [SAMPLED]
    assert g1.get_state().equal(g2.get_state())  # exactly one uniform consumed


def _random_case(seed: int, vocab: int = 12):
    g = torch.Generator().manual_seed(seed)
    parents = [-1, 0, 0, 1, 2, 4]
    q = torch.softmax(torch.randn(len(parents), vocab, generator=g), -1)
    tokens = [int(torch.multinomial(q[i], 1, generator=g)) for i in range(len(parents))]
    tree = DraftTree.from_parents(tokens, parents, draft_probs=q)
    logits = torch.randn(len(parents), vocab, generator=g) * 2
    return tree, logits


def test_seeded_request_is_independent_of_the_batch_around_it():
    tree, logits = _random_case(0)
    params = dict(temperature=0.9, top_k=8, top_p=0.95)

    def run_in(batch_of: int, step_seed: int) -> list[int]:
        trees, rows, gens = [tree], [logits], [torch.Generator().manual_seed(step_seed)]
        for j in range(1, batch_of):
            other_tree, other_logits = _random_case(100 + j)
            trees.append(other_tree)
            rows.append(other_logits)
            gens.append(None if j % 2 else torch.Generator().manual_seed(j))
        n = len(trees)
        sampling = SamplingTensors.from_lists(
            [params["temperature"]] + [0.0 if j % 3 == 0 else 0.7 for j in range(1, n)],
            [params["top_k"]] * n,
            [params["top_p"]] * n,
        )
        r = verify(torch.cat(rows), TreeBatch.from_trees(trees), sampling, gens)
        return r.emitted_tokens()[0]

    outcomes = [run_in(1, s) for s in range(40)]
    assert outcomes == [run_in(7, s) for s in range(40)]
    assert len({tuple(o) for o in outcomes}) > 1  # it really samples


def test_mixed_batch_rows_match_their_single_kind_runs():
    cases = [_random_case(s) for s in range(6)]
    trees = [c[0] for c in cases]
    logits = torch.cat([c[1] for c in cases])
    temps = [0.0, 1.0, 0.0, 0.5, 1.3, 0.0]
    uniforms = torch.rand(6, 6, generator=torch.Generator().manual_seed(9), dtype=torch.float64)
    mixed = verify(logits, TreeBatch.from_trees(trees), SamplingTensors.from_lists(temps), uniforms=uniforms)
    for b, (tree, row_logits) in enumerate(cases):
        alone = verify(row_logits, TreeBatch.from_trees([tree]), one(temps[b]), uniforms=uniforms[b : b + 1])
        assert mixed.emitted_tokens()[b] == alone.emitted_tokens()[0]
        assert mixed.rejection_cause[b] == alone.rejection_cause[0]
        if temps[b] == 0:
            last, nxt = verify_greedy(row_logits, TreeBatch.from_trees([tree]))
            assert int(mixed.last_node[b]) == int(last) and int(mixed.next_token[b]) == int(nxt)
            assert mixed.rejection_cause[b] in (None, "token_mismatch")


def test_nan_and_inf_logits_never_produce_invalid_ids():
    vocab = 6
    tree = DraftTree.chain(0, [1, 2], draft_probs=torch.softmax(torch.randn(2, vocab), -1))
    batch = TreeBatch.from_trees([tree] * 4)
    logits = torch.randn(12, vocab)
    logits[0:3] = float("nan")
    logits[3:6, 2] = float("inf")
    logits[6:9] = -float("inf")
    logits[9:12, ::2] = float("nan")
    for seed in range(20):
        g = [torch.Generator().manual_seed(seed + i) for i in range(4)]
        r = verify(logits, batch, SamplingTensors.from_lists([1.0, 0.7, 2.0, 0.3], top_p=[0.9] * 4), g)
        for row in r.emitted_tokens():
            assert all(0 <= t < vocab for t in row)
        # Poisoned entries carry no mass: the +inf token and the NaN columns are never emitted.
        assert 2 not in r.emitted_tokens()[1][-1:]
        assert all(t % 2 == 1 for t in r.emitted_tokens()[3][-1:])


def test_backends_can_replace_the_rejection_sampler():
    calls = []

    def fused(probs, trees, uniforms):
        calls.append((probs.shape, uniforms.shape))
        return reference_ops().rejection_sample(probs, trees, uniforms)

    ops = reference_ops().with_overrides("test", rejection_sample=fused)
    tree, logits = _random_case(3)
    uniforms = torch.rand(1, 6, dtype=torch.float64)
    a = verify(logits, TreeBatch.from_trees([tree]), one(), uniforms=uniforms, ops=ops)
    b = verify(logits, TreeBatch.from_trees([tree]), one(), uniforms=uniforms)
    assert calls == [((6, 12), (1, 6))] and a.emitted_tokens() == b.emitted_tokens()


def test_a_rejection_at_depth_two_reports_outcomes_per_position():
    tree = DraftTree.chain(2, [0, 1], draft_probs=torch.tensor([Q, [0.0, 1.0, 0.0]]))
    logits = logits_of(P_ROOT, [0.9, 0.05, 0.05], P_AFTER)
    # Token 0: ratio 0.5, u=0.1 accepts.  Token 1 at depth 2: p=0.05, q=1, u=0.5 rejects;
    # residual max(0, p - q) = [0.9, 0, 0.05] -> token 0 for u_final = 0.5.
    r = verify(logits, TreeBatch.from_trees([tree]), one(), uniforms=torch.tensor([[0.5, 0.1, 0.5]]))
    assert r.emitted_tokens() == [[0, 0]]
    assert r.position_outcome.tolist() == [[1, 0]] and r.num_accepted.tolist() == [1]
    assert r.rejection_cause == ["probability_rejected"] and r.last_node.tolist() == [1]
