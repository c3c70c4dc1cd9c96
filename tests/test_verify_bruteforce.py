"""Stochastic verification against brute-force enumeration on tiny vocabularies.

Two halves:
1. An exact reference (scalar float64, written from the papers' definition)
   enumerates every draft outcome and every accept/reject branch with its
   probability.  Extending each emitted sequence with the target's own
   sampling gives the exact output distribution, which must equal the
   target's to 1e-9 for chains, i.i.d. siblings, siblings drawn without
   replacement (with conditioned q) and deterministic top-k siblings, and must
   NOT equal it for the two classic bugs (q reported before top-p; siblings
   drawn without replacement but reported with the unconditioned q).
2. The implementation (``verify`` with injected uniforms) makes, point by
   point, the same decision as the reference's sampling procedure for random
   drafts and uniforms.  Together: the implementation is lossless.
"""
from __future__ import annotations

import itertools
import math
import random

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from hyspec.ops.sampling import SamplingTensors
from hyspec.seam.tree import TreeBatch
from hyspec.spec.verify import verify

SCHEMES = ("iid", "without_replacement", "deterministic")


class Problem:
    """A tiny tree-shaped drafting problem with a Markov target and draft.

    p after a node at depth d holding token t is ``p_table[d][t]``; the draft
    distribution for children of that node is ``q_table[d][t]``.
    """

    def __init__(self, parents, p_table, q_table, scheme, root=0):
        self.parents, self.p_table, self.q_table, self.scheme, self.root = parents, p_table, q_table, scheme, root
        self.n = len(parents)
        self.vocab = len(p_table[0][0])
        self.depth = [0] * self.n
        for i in range(1, self.n):
            self.depth[i] = self.depth[parents[i]] + 1
        self.children = [[c for c in range(self.n) if parents[c] == i] for i in range(self.n)]
        self.sib_rank = [0] + [self.children[parents[i]].index(i) for i in range(1, self.n)]

    def draft_options(self, i, tokens, qrows):
        """(token, probability, reported q row) choices for node i given earlier nodes."""
        par = self.parents[i]
        q = self.q_table[self.depth[par]][tokens[par]]
        earlier = [tokens[s] for s in self.children[par] if s < i]
        if self.scheme == "iid":
            return [(x, q[x], q) for x in range(self.vocab) if q[x] > 0]
        if self.scheme == "deterministic":
            order = sorted(range(self.vocab), key=lambda x: (-q[x], x))
            x = order[self.sib_rank[i]]
            return [(x, 1, [int(y == x) for y in range(self.vocab)])]
        rest = [q[x] * 0 if x in earlier else q[x] for x in range(self.vocab)]
        z = sum(rest)
        cond = [r / z for r in rest]
        return [(x, cond[x], cond) for x in range(self.vocab) if cond[x] > 0]

    def all_drafts(self):
        """Every (tokens, q rows, probability) the drafter can produce."""
        def rec(i, tokens, qrows, prob):
            if i == self.n:
                yield list(tokens), list(qrows), prob
                return
            for x, px, qrow in self.draft_options(i, tokens, qrows):
                yield from rec(i + 1, tokens + [x], qrows + [qrow], prob * px)
        yield from rec(1, [self.root], [None], 1.0)

    def p_at(self, node, tokens):
        return self.p_table[self.depth[node]][tokens[node]]


def _residual(p, q):
    r = [a - b if a > b else a * 0 for a, b in zip(p, q)]  # keeps Fractions exact
    z = sum(r)
    return [x / z for x in r] if z > 1e-30 else p


def exact_step(problem, tokens, qrows, prob, out, node=0, prefix=(), p_cur=None, record=None):
    """Add to ``out`` the probability of each emitted tuple for fixed drafts (recursive RRS).

    With ``record`` (a dict of sets), also collect every threshold the uniforms are
    compared with: acceptance probabilities under the child's index, CDF values under 0.
    """
    p_cur = problem.p_at(node, tokens) if p_cur is None else p_cur
    for c in problem.children[node]:
        x, q = tokens[c], qrows[c]
        a = min(1, p_cur[x] / q[x]) if q[x] > 0 else int(p_cur[x] > 0)
        if record is not None:
            record.setdefault(c, set()).add(a)
        if a > 0:
            exact_step(problem, tokens, qrows, prob * a, out, c, prefix + (x,), record=record)
        prob *= 1 - a
        if prob == 0:
            return
        p_cur = _residual(p_cur, q)
    if record is not None:
        record.setdefault(0, set()).update(itertools.accumulate(p_cur))
    for y, py in enumerate(p_cur):
        if py > 0:
            out[prefix + (y,)] = out.get(prefix + (y,), 0.0) + prob * py


def output_distribution(problem):
    """Exact distribution of the first max_depth+1 tokens when one verification step is continued by the target."""
    length = max(problem.depth) + 1
    emitted = {}
    for tokens, qrows, prob in problem.all_drafts():
        exact_step(problem, tokens, qrows, prob, emitted)
    full = {}
    for seq, prob in emitted.items():
        for tail in itertools.product(range(problem.vocab), repeat=length - len(seq)):
            pr, prev = prob, seq[-1]
            for d, t in enumerate(tail, start=len(seq)):
                pr *= problem.p_table[d][prev][t]
                prev = t
            if pr > 0:
                full[seq + tail] = full.get(seq + tail, 0.0) + pr
    return full


def target_distribution(problem):
    length = max(problem.depth) + 1
    out = {}
    for seq in itertools.product(range(problem.vocab), repeat=length):
        pr, prev = 1.0, problem.root
        for d, t in enumerate(seq):
            pr *= problem.p_table[d][prev][t]
            prev = t
        if pr > 0:
            out[seq] = pr
    return out


def total_variation(a, b):
    return 0.5 * sum(abs(a.get(k, 0.0) - b.get(k, 0.0)) for k in set(a) | set(b))


# --- strategies -------------------------------------------------------------------------------

def dist(vocab):
    """A probability vector, sometimes with zeros (as top-k / top-p leave them)."""
    return st.lists(st.integers(0, 6), min_size=vocab, max_size=vocab).filter(any).map(
        lambda w: [x / sum(w) for x in w]
    )


@st.composite
def problems(draw, schemes=SCHEMES):
    vocab = draw(st.integers(2, 4))
    n = draw(st.integers(2, 4))
    parents = [-1] + [draw(st.integers(0, i - 1)) for i in range(1, n)]
    scheme = draw(st.sampled_from(schemes))
    depth = [0] * n
    for i in range(1, n):
        depth[i] = depth[parents[i]] + 1
    max_siblings = max(parents.count(i) for i in range(n))
    tables = [[[draw(dist(vocab)) for _ in range(vocab)] for _ in range(max(depth) + 1)] for _ in range(2)]
    problem = Problem(parents, tables[0], tables[1], scheme)
    if scheme != "iid":  # distinct siblings need enough tokens with q mass
        assume(all(sum(x > 0 for x in row) >= max_siblings for level in tables[1] for row in level))
    return problem


# --- 1. the maths ------------------------------------------------------------------------------

@settings(max_examples=200, deadline=None)
@given(problem=problems())
def test_recursive_rejection_sampling_is_exactly_lossless(problem):
    assert total_variation(output_distribution(problem), target_distribution(problem)) < 1e-9


def test_q_before_top_p_is_not_lossless():
    """Drafts drawn from the top-p-processed q but verified with q before top-p: biased."""
    raw = [0.5, 0.3, 0.2]
    processed = [0.625, 0.375, 0.0]  # top-p 0.75 applied to raw
    p = [[[0.2, 0.3, 0.5]] * 3] * 2
    problem = Problem([-1, 0], p, [[processed] * 3] * 2, "iid")
    honest = output_distribution(problem)
    assert total_variation(honest, target_distribution(problem)) < 1e-12
    broken = {}
    for tokens, _, prob in problem.all_drafts():
        exact_step(problem, tokens, [None, raw], prob, broken)  # the reported q is the raw one
    assert total_variation(broken, target_distribution(problem)) > 0.05


def test_without_replacement_with_unconditioned_q_is_not_lossless():
    q = [0.7, 0.2, 0.1]
    p = [[[0.1, 0.1, 0.8]] * 3] * 2
    problem = Problem([-1, 0, 0], p, [[q] * 3] * 2, "without_replacement")
    assert total_variation(output_distribution(problem), target_distribution(problem)) < 1e-12
    broken = {}
    for tokens, _, prob in problem.all_drafts():
        exact_step(problem, tokens, [None, q, q], prob, broken)
    assert total_variation(broken, target_distribution(problem)) > 0.01


# --- 2. the implementation makes the reference's decisions -------------------------------------

def reference_decide(problem, tokens, qrows, p_rows, u):
    """The reference procedure driven by uniforms; returns (emitted tuple, smallest decision margin)."""
    node, p_cur, prefix, margin = 0, p_rows[0], (), math.inf
    while True:
        chosen = None
        for c in problem.children[node]:
            x, q = tokens[c], qrows[c]
            margin = min(margin, abs(u[c] * q[x] - p_cur[x]))
            if u[c] * q[x] < p_cur[x]:
                chosen = c
                break
            p_cur = _residual(p_cur, q)
        if chosen is None:
            break
        node, prefix, p_cur = chosen, prefix + (tokens[chosen],), p_rows[chosen]
    cdf = list(itertools.accumulate(p_cur))
    target = u[0] * cdf[-1]
    margin = min(margin, *(abs(target - c) for c in cdf))
    y = next(i for i, c in enumerate(cdf) if c > target)
    return prefix + (y,), margin


def batch_of(problem, tokens, qrows):
    """TreeBatch of equally shaped trees straight from tensors (no per-tree objects)."""
    reps = len(tokens)
    probs = None
    if problem.scheme != "deterministic":
        probs = torch.tensor([[[0.0] * problem.vocab] + q[1:] for q in qrows], dtype=torch.float32)
    parents = torch.tensor(problem.parents).expand(reps, -1)
    return TreeBatch(torch.tensor(tokens), parents, torch.full((reps,), problem.n), probs, problem.vocab)


def sample_drafts(problem, rng):
    tokens, qrows = [problem.root], [None]
    for i in range(1, problem.n):
        options = problem.draft_options(i, tokens, qrows)
        x, _, qrow = rng.choices(options, weights=[o[1] for o in options])[0]
        tokens.append(x)
        qrows.append(qrow)
    return tokens, qrows


@settings(max_examples=60, deadline=None)
@given(problem=problems(), seed=st.integers(0, 2**31), temperature=st.sampled_from([1.0, 0.7]))
def test_implementation_matches_the_reference_pointwise(problem, seed, temperature):
    rng = random.Random(seed)
    reps = 32
    drafts = [sample_drafts(problem, rng) for _ in range(reps)]
    logits = []
    for tokens, _ in drafts:
        # Logits whose processed distribution (at this temperature) is p: log(p) * T.
        for i in range(problem.n):
            logits.append(torch.tensor(problem.p_at(i, tokens), dtype=torch.float64).log() * temperature)
    logits = torch.stack(logits).float()
    batch = batch_of(problem, [d[0] for d in drafts], [d[1] for d in drafts])
    sampling = SamplingTensors.from_lists([temperature] * reps)
    uniforms = torch.rand(reps, problem.n, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    result = verify(logits, batch, sampling, uniforms=uniforms)
    # The reference reads the very fp32 distributions the implementation uses.
    p_rows = sampling.repeat(batch.num_nodes_host).process(logits).double().view(reps, problem.n, -1).tolist()
    q_rows = None if batch.draft_probs is None else batch.draft_probs.double().tolist()
    compared = 0
    for b, ((tokens, _), emitted) in enumerate(zip(drafts, result.emitted_tokens())):
        qr = q_rows[b] if q_rows is not None else [None] + [
            [float(y == tokens[i]) for y in range(problem.vocab)] for i in range(1, problem.n)
        ]
        expected, margin = reference_decide(problem, tokens, qr, p_rows[b], uniforms[b].tolist())
        if margin < 1e-6:  # u within rounding of a threshold: fp32 vs float64 may differ
            continue
        compared += 1
        assert tuple(emitted) == expected, (b, tokens, uniforms[b].tolist())
    assert compared >= reps // 2


@pytest.mark.parametrize("scheme", SCHEMES)
def test_exact_uniform_grid_gives_the_implementations_exact_distribution(scheme):
    """Drive the implementation over a grid of uniforms that hits no threshold: exact probabilities.

    Root with two sibling drafts, vocab 3, rational p and q.  The implementation is
    a step function of (u_final, u_child1, u_child2) whose steps sit at rational
    thresholds (acceptance probabilities, CDF values).  With G_a points per axis a
    and G_a a multiple of every threshold's denominator on that axis, the midpoints
    (k + 1/2) / G_a count every interval exactly, so the grid average IS the
    implementation's exact output distribution, which must equal the reference's.
    """
    from fractions import Fraction as F

    p_root, q_root, p_child = [F(1, 8), F(1, 2), F(3, 8)], [F(1, 2), F(1, 4), F(1, 4)], [F(1, 2), F(1, 6), F(1, 3)]
    problem = Problem([-1, 0, 0], [[p_root] * 3, [p_child] * 3], [[q_root] * 3] * 2, scheme)
    exact, record = {}, {}
    for tokens, qrows, prob in problem.all_drafts():
        exact_step(problem, tokens, qrows, prob, exact, record=record)
    grids = [math.lcm(*(F(t).denominator for t in record.get(axis, {1}))) for axis in range(3)]
    assert max(grids) <= 48, grids  # precondition of an exact, affordable grid
    axes = [(torch.arange(g, dtype=torch.float64) + 0.5) / g for g in grids]
    u = torch.cartesian_prod(*axes)  # [G0 * G1 * G2, 3]
    sampling = SamplingTensors.from_lists([1.0] * u.shape[0])
    measured = {}
    for tokens, qrows, prob in problem.all_drafts():
        float_q = [None] + [[float(x) for x in row] for row in qrows[1:]]
        batch = batch_of(problem, [tokens] * u.shape[0], [float_q] * u.shape[0])
        rows = [[float(x) for x in problem.p_at(i, tokens)] for i in range(3)]
        logits = torch.tensor(rows, dtype=torch.float64).log().float().repeat(u.shape[0], 1)
        result = verify(logits, batch, sampling, uniforms=u)
        for seq in result.emitted_tokens():
            measured[tuple(seq)] = measured.get(tuple(seq), 0.0) + float(prob) / u.shape[0]
    assert set(measured) <= set(exact)
    for seq, pr in exact.items():
        assert measured.get(seq, 0.0) == pytest.approx(float(pr), abs=1e-9), seq
