"""Fused Triton rejection sampler vs the reference verifier, on CPU under TRITON_INTERPRET=1."""
from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"  # before the kernel modules import triton's jit

import pytest  # noqa: E402
import torch  # noqa: E402

pytest.importorskip("triton")

from hyspec.cuda_ops.common import KernelInputError  # noqa: E402
from hyspec.cuda_ops.verify import triton_rejection_sample  # noqa: E402
from hyspec.ops.rejection import rejection_sample  # noqa: E402
from hyspec.ops.sampling import SamplingTensors  # noqa: E402
from hyspec.seam.tree import TreeBatch  # noqa: E402


def random_case(seed: int, sizes: list[int], vocab: int, sampled: bool, peaked: bool = False):
    """Random trees; p after every node (top-k/top-p processed); drafts drawn from stored q rows.

    ``peaked``: drafts drawn from (almost) the target's own p, so most are accepted and the
    sampler descends deep before it stops (exercises descent and bonus tokens).
    """
    gen = torch.Generator().manual_seed(seed)
    b, n = len(sizes), max(sizes)
    parents = torch.full((b, n), -1, dtype=torch.int64)
    tokens = torch.randint(0, vocab, (b, n), generator=gen)
    for row, size in enumerate(sizes):
        for i in range(1, size):
            parents[row, i] = int(torch.randint(0, i, (1,), generator=gen))
    rows = sum(sizes)
    target = SamplingTensors.from_lists([0.8] * rows, [min(vocab, 12)] * rows, [0.95] * rows).process(
        torch.randn(rows, vocab, generator=gen) * (6 if peaked else 2))
    q = None
    if sampled:
        q = SamplingTensors.from_lists([1.0] * (b * n)).process(
            torch.randn(b * n, vocab, generator=gen) * 2).view(b, n, vocab)
    trees = TreeBatch(tokens, parents, torch.tensor(sizes), q, vocab)
    if peaked or sampled:
        # Draw each node's token from its q (sampled) or from the target's p at its parent (peaked).
        for row in range(b):
            for i in range(1, sizes[row]):
                parent_row = int(trees.packed_index[row, int(parents[row, i])])
                if sampled and peaked:  # q close to p: accepted unless an earlier sibling was
                    q[row, i] = 0.9 * target[parent_row] + 0.1 * q[row, i]
                dist = q[row, i] if sampled else target[parent_row]
                tokens[row, i] = int(torch.multinomial(dist, 1, generator=gen))
        trees = TreeBatch(tokens, parents, torch.tensor(sizes), q, vocab)
    uniforms = torch.rand(b, n, generator=gen, dtype=torch.float64)
    return target, trees, uniforms


def assert_same(target, trees, uniforms) -> None:
    ref_cur, ref_tok = rejection_sample(target, trees, uniforms)
    cur, tok = triton_rejection_sample(target, trees, uniforms)
    assert cur.tolist() == ref_cur.tolist()
    assert tok.tolist() == ref_tok.tolist()


@pytest.mark.parametrize("sampled", [True, False], ids=["q_rows", "one_hot"])
@pytest.mark.parametrize("peaked", [False, True], ids=["random", "mostly_accepted"])
def test_trees_match_reference(sampled: bool, peaked: bool) -> None:
    for seed in range(4):
        sizes = [1 + (seed * 7 + r * 3) % 9 for r in range(6)]
        assert_same(*random_case(seed, sizes, vocab=40, sampled=sampled, peaked=peaked))


def test_chains_and_a_vocabulary_wider_than_one_block() -> None:
    # 3000 > MAX_BLOCK_V: every row pass loops over several blocks, the CDF carries across them.
    target, trees, uniforms = random_case(11, [5, 5, 1], vocab=3000, sampled=True)
    chain_parents = torch.tensor([[-1, 0, 1, 2, 3]] * 3)
    trees = TreeBatch(trees.tokens, chain_parents, trees.num_nodes, trees.draft_probs, 3000)
    assert_same(target, trees, uniforms)


def test_uniforms_near_one_never_pick_a_zero_probability_token() -> None:
    target, trees, uniforms = random_case(3, [4, 2], vocab=64, sampled=False)
    uniforms[:, 0] = 1.0 - 1e-12
    cur, tok = triton_rejection_sample(target, trees, uniforms)
    ref_cur, ref_tok = rejection_sample(target, trees, uniforms)
    assert tok.tolist() == ref_tok.tolist()
    assert cur.tolist() == ref_cur.tolist()


def test_bad_inputs_are_named_before_launch() -> None:
    target, trees, uniforms = random_case(0, [3, 2], vocab=16, sampled=True)
    with pytest.raises(KernelInputError, match="float32"):
        triton_rejection_sample(target.double(), trees, uniforms)
    with pytest.raises(KernelInputError, match="uniforms"):
        triton_rejection_sample(target, trees, uniforms[:1])
    with pytest.raises(KernelInputError, match="draft_probs"):
        triton_rejection_sample(target[:, :8], trees, uniforms)


@pytest.mark.parametrize("sampled", [False, True], ids=["one_hot", "q_rows"])
def test_the_race_prone_case_matches_the_reference(sampled: bool) -> None:
    """The shape that exposed the sampler's race on a GPU (cuda_ops/verify.py, "Races"), run here as a regression.

    Duplicate sibling tokens (a rejected token met again), the residual zeroed across the last, partial
    vocabulary chunk (three 1024-wide chunks), many sequences, several draws (cuda_ops/cases.py).  Under the
    interpreter threads run one after another, so this checks the algorithm; scripts/gpu_first_contact.sh
    repeats it on a GPU, where the old kernel's unfenced scratch writes could make warps disagree.
    """
    from hyspec.cuda_ops.cases import race_prone_verify_case

    for seed in range(3):
        target, trees, uniforms = race_prone_verify_case(seed, sampled)
        assert_same(target, trees, uniforms)
