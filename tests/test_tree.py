"""hyspec.seam.tree: draft trees, padded batches, and the packed layout the attention op reads."""
from __future__ import annotations

import pytest
import torch

from hyspec.errors import HyspecError
from hyspec.ops.attention import AttentionMetadata, visibility_mask
from hyspec.seam.tree import DraftTree, TreeBatch


def test_chain_is_a_tree_with_one_child_per_node():
    q = torch.softmax(torch.randn(3, 10), -1)
    tree = DraftTree.chain(7, [1, 2, 3], draft_probs=q)
    assert tree.tokens.tolist() == [7, 1, 2, 3]
    assert tree.parents.tolist() == [-1, 0, 1, 2]
    assert tree.depths.tolist() == [0, 1, 2, 3]
    assert tree.vocab_size == 10 and tree.draft_probs.shape == (4, 10)
    torch.testing.assert_close(tree.draft_probs[1:], q)
    assert tree.ancestor_mask().tolist() == torch.tril(torch.ones(4, 4, dtype=torch.bool)).tolist()
    assert tree.paths() == [[0, 1, 2, 3]]
    assert DraftTree.chain(5, []).paths() == [[0]]


def test_tree_structure():
    #        0
    #      /   \
    #     1     2
    #    / \     \
    #   3   4     5
    tree = DraftTree.from_parents([9, 1, 2, 3, 4, 5], [-1, 0, 0, 1, 1, 2], vocab_size=16)
    assert tree.depths.tolist() == [0, 1, 1, 2, 2, 2]
    anc = tree.ancestor_mask()
    assert anc[4].nonzero().flatten().tolist() == [0, 1, 4]
    assert anc[5].nonzero().flatten().tolist() == [0, 2, 5]
    assert tree.paths() == [[0, 1, 3], [0, 1, 4], [0, 2, 5]]


@pytest.mark.parametrize(
    "tokens, parents, kwargs, message",
    [
        ([1, 2], [0, 0], {}, "root's parent"),
        ([1, 2, 3], [-1, 0, 2], {}, "node 2 of tree 0 has parent 2"),
        ([1, 2, 3], [-1, 2, 0], {}, "node 1 of tree 0 has parent 2"),
        ([1, 2, 30], [-1, 0, 1], {"vocab_size": 16}, "token 30, outside"),
        ([1, -2], [-1, 0], {}, "token -2"),
        ([1, 2], [-1, 0, 1], {}, "parents must have shape"),
        ([1, 2], [-1, 0], {"draft_probs": torch.zeros(3, 4)}, "draft_probs must be a float"),
        ([1, 2], [-1, 0], {"draft_probs": torch.zeros(2, 4), "vocab_size": 8}, "vocab_size is 8"),
    ],
)
def test_bad_trees_are_rejected_with_a_clear_message(tokens, parents, kwargs, message):
    with pytest.raises(HyspecError, match=message):
        DraftTree.from_parents(tokens, parents, **kwargs)


def _batch() -> TreeBatch:
    return TreeBatch.from_trees(
        [
            DraftTree.chain(3, [4, 5], vocab_size=16),
            DraftTree.from_parents([9, 1, 2, 3, 4, 5], [-1, 0, 0, 1, 1, 2], vocab_size=16),
            DraftTree.chain(8, [], vocab_size=16),
        ]
    )


def test_tree_batch_padding_and_derived_tensors():
    batch = _batch()
    assert batch.batch_size == 3 and batch.max_nodes == 6 and batch.num_tokens == 10
    assert batch.num_nodes_host == [3, 6, 1] and batch.max_depth == 2
    assert batch.tokens[0].tolist() == [3, 4, 5, 0, 0, 0]
    assert batch.parents[2].tolist() == [-1] * 6
    assert batch.packed_index.tolist() == [
        [0, 1, 2, -1, -1, -1],
        [3, 4, 5, 6, 7, 8],
        [9, -1, -1, -1, -1, -1],
    ]
    assert batch.query_start_loc().tolist() == [0, 3, 9, 10]
    assert batch.children[1, 0].tolist() == [1, 2] and batch.children[1, 2].tolist() == [5, -1]
    assert batch.children[0, 1].tolist() == [2, -1] and (batch.children[2] == -1).all()
    assert batch.packed_tokens().tolist() == [3, 4, 5, 9, 1, 2, 3, 4, 5, 8]
    assert batch.positions(torch.tensor([10, 20, 30])).tolist() == [10, 11, 12, 20, 21, 21, 22, 22, 22, 30]
    assert batch.draft_probs is None


def test_path_nodes_follow_depth_order():
    batch = _batch()
    nodes = batch.path_nodes(torch.tensor([2, 4, 0]))
    assert nodes.tolist() == [[1, 2], [1, 4], [-1, -1]]


def test_packed_tree_mask_drives_the_attention_op():
    """The packed mask puts each node's ancestors (and only them) in its attention window."""
    batch = _batch()
    ctx = [5, 2, 7]
    q_lens = batch.num_nodes_host
    seq_lens = [c + n for c, n in zip(ctx, q_lens)]
    meta = AttentionMetadata(
        query_start_loc=batch.query_start_loc(),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        block_tables=torch.zeros(3, 4, dtype=torch.int32),
        slot_mapping=torch.zeros(batch.num_tokens, dtype=torch.int64),
        positions=batch.positions(torch.tensor(ctx)),
        tree_mask=batch.packed_tree_mask(),
        query_lens=q_lens,
        seq_lens_host=seq_lens,
    )
    vis = visibility_mask(meta, torch.device("cpu"))  # [B, Q, L]
    for b, tree_ctx in enumerate(ctx):
        for i in range(q_lens[b]):
            seen_new = vis[b, i, tree_ctx : seq_lens[b]].nonzero().flatten().tolist()
            assert seen_new == batch.ancestors[b, i].nonzero().flatten().tolist()
            assert vis[b, i, :tree_ctx].all()


def test_mixed_draft_probs_become_one_hot_rows():
    q = torch.softmax(torch.randn(2, 6), -1)
    batch = TreeBatch.from_trees([DraftTree.chain(0, [1, 2], draft_probs=q), DraftTree.chain(0, [5], vocab_size=6)])
    assert batch.draft_probs.shape == (2, 3, 6) and batch.vocab_size == 6
    torch.testing.assert_close(batch.draft_probs[0, 1:], q)
    assert batch.draft_probs[1, 1].tolist() == [0, 0, 0, 0, 0, 1.0]
    assert batch.draft_probs[1, 2].sum() == 0  # padding


def test_tree_batch_from_tensors_validates_and_trims():
    tokens = torch.tensor([[1, 2, 3, 0], [4, 5, 0, 0]])
    parents = torch.tensor([[-1, 0, 0, -1], [-1, 0, 7, 7]])  # padding may hold anything
    batch = TreeBatch(tokens, parents, torch.tensor([3, 2]))
    assert batch.max_nodes == 3 and batch.parents[1].tolist() == [-1, 0, -1]
    sub = batch.select([1])
    assert sub.max_nodes == 2 and sub.tokens.tolist() == [[4, 5]]
    with pytest.raises(HyspecError, match="node 2 of tree 1"):
        TreeBatch(tokens, torch.tensor([[-1, 0, 0, -1], [-1, 0, 3, 0]]), torch.tensor([3, 3]))
    with pytest.raises(HyspecError, match="num_nodes must be in"):
        TreeBatch(tokens, parents, torch.tensor([0, 2]))
    with pytest.raises(HyspecError, match="disagree on the vocabulary size"):
        TreeBatch.from_trees([DraftTree.chain(0, [1], vocab_size=4), DraftTree.chain(0, [1], vocab_size=5)])


def test_host_and_vectorized_structure_agree_on_random_padded_batches():
    """CPU trees take a host-list path for depths, ancestors and children (fewer small tensor ops); the vectorized
    path (what CUDA/NPU trees use) must give the same tensors."""
    from hyspec.seam import tree as T

    gen = torch.Generator().manual_seed(0)
    for trial in range(30):
        b, n = 1 + trial % 4, 1 + int(torch.randint(1, 26, (1,), generator=gen))
        parents = torch.full((b, n), -1, dtype=torch.int64)
        sizes = torch.randint(1, n + 1, (b,), generator=gen)
        for r in range(b):
            for i in range(1, int(sizes[r])):
                parents[r, i] = int(torch.randint(0, i, (1,), generator=gen))
        valid = torch.arange(n)[None, :] < sizes[:, None]
        d_host, a_host = T._depths_and_ancestors_host(parents, valid)
        d_vec, a_vec = T._depths_and_ancestors_vectorized(parents, valid)
        assert torch.equal(d_host, d_vec) and torch.equal(a_host, a_vec)
        c_vec = T._child_table_vectorized(parents, valid)
        c_host = T._child_table(parents, valid)
        assert c_host.dtype == c_vec.dtype and torch.equal(c_host, c_vec), (parents, valid)


def _tensor_path(tokens, parents, sizes, vocab):
    """What TreeBatch derives with tensor ops (the CUDA / NPU path), computed here on the CPU."""
    from hyspec.seam import tree as T

    n = int(sizes.max())
    tokens, parents = tokens[:, :n], parents[:, :n]
    valid = torch.arange(n)[None, :] < sizes[:, None]
    tokens, parents = tokens.masked_fill(~valid, 0), parents.masked_fill(~valid, -1)
    T._check_structure(tokens, parents, sizes, vocab, "TreeBatch")
    depths, ancestors = T._depths_and_ancestors_vectorized(parents, valid)
    offsets = torch.cumsum(sizes, 0) - sizes
    packed = torch.where(valid, offsets[:, None] + torch.arange(n)[None, :], -1)
    return dict(tokens=tokens, parents=parents, valid=valid, depths=depths, ancestors=ancestors,
                children=T._child_table_vectorized(parents, valid), packed_index=packed,
                max_depth=int(depths.max()))


def test_a_cpu_tree_batch_built_from_host_lists_equals_the_tensor_path_values_and_errors():
    """CPU batches derive everything from host lists (__post_init__'s tensor ops cost ~150 us a verifying step);
    the values, and the first error in the same order, must be the tensor path's."""
    gen = torch.Generator().manual_seed(1)
    for trial in range(40):
        b, n, vocab = 1 + trial % 5, 1 + int(torch.randint(1, 20, (1,), generator=gen)), 50
        sizes = torch.randint(1, n + 1, (b,), generator=gen)
        tokens = torch.randint(0, vocab, (b, n + 2), generator=gen)  # wider than needed: trimmed
        parents = torch.randint(-3, 30, (b, n + 2), generator=gen)  # padding may hold anything
        for r in range(b):
            parents[r, 0] = -1
            for i in range(1, int(sizes[r])):
                parents[r, i] = int(torch.randint(0, i, (1,), generator=gen))
        if trial % 4 == 1:  # one bad parent, token or root somewhere among the real nodes
            r = int(torch.randint(0, b, (1,), generator=gen))
            i = int(torch.randint(0, int(sizes[r]), (1,), generator=gen))
            [parents, tokens, parents][trial // 4 % 3][r, i] = [i + 1, vocab + 3, 5][trial // 4 % 3]
        try:
            want = _tensor_path(tokens, parents, sizes, vocab)
        except HyspecError as e:
            with pytest.raises(HyspecError) as got:
                TreeBatch(tokens, parents, sizes, None, vocab)
            assert str(got.value) == str(e)
            continue
        batch = TreeBatch(tokens, parents, sizes, None, vocab)
        for name, value in want.items():
            have = getattr(batch, name)
            assert (have == value if name == "max_depth" else
                    have.dtype == value.dtype and torch.equal(have, value)), (trial, name)


def test_tree_batch_lives_where_verification_asks_and_verify_refuses_a_device_mismatch():
    # ngram / suffix draft on the host while the target's logits are on the GPU: on an H200 the batch was
    # built on the CPU and verify_greedy's gather failed (index on cpu, logits on cuda:0).  Only the CPU is
    # here, so the mismatch is shown with the meta device, which verify must refuse before computing.
    from hyspec.ops.sampling import SamplingTensors
    from hyspec.spec.verify import verify

    trees = [DraftTree.chain(0, [1, 2], vocab_size=6), DraftTree.chain(3, [4], vocab_size=6)]
    batch = TreeBatch.from_trees(trees, device="cpu")
    assert batch.tokens.device == batch.parents.device == torch.device("cpu")
    from hyspec import SamplingParams

    sampling = SamplingTensors.from_params([SamplingParams(temperature=0.0)] * 2)
    with pytest.raises(HyspecError, match="trees are on cpu but the target's logits on meta"):
        verify(torch.empty(batch.num_tokens, 6, device="meta"), batch, sampling)
