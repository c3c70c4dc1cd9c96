"""Training recipes for eagle / eagle3: options, gradients, and training = inference for EAGLE-3's unroll."""
from __future__ import annotations

import pytest
import torch

from hyspec.drafters.eagle.model import default_aux_layer_ids
from hyspec.drafters.eagle.recipe import Eagle3Recipe, EagleRecipe, ttt_unroll
from hyspec.errors import ConfigError
from hyspec.kv.pool import KVPool
from hyspec.kv.sequence_kv import SequenceKV
from hyspec.seam.forward import Feed, build_inputs
from hyspec.train.base import TargetBatch
from tests.drafters.test_eagle_checkpoint import tiny_target


@pytest.fixture(scope="module")
def target():
    return tiny_target(layers=4)


def _perturbed(head):
    with torch.no_grad():
        for name, p in head.named_parameters():
            if "norm" in name:
                p.add_(torch.randn_like(p) * 0.1)
    return head


def test_registered_for_train_draft():
    from hyspec.train.registry import resolve_recipe

    assert isinstance(resolve_recipe("eagle"), EagleRecipe)
    assert isinstance(resolve_recipe("eagle3"), Eagle3Recipe)


def test_eagle3_reads_the_public_default_layers():
    # vLLM / SafeAILab capture the inputs of layers (2, L//2, L-3); hyspec's aux layer j is the output of j.
    assert default_aux_layer_ids(32) == (2, 16, 29)
    assert Eagle3Recipe().aux_layers(tiny_target(layers=8).config) == (1, 3, 4)


def test_ttt_unroll_equals_tree_drafting_over_the_paged_cache(target):
    """Step j at pair i of the unroll == a depth-j node drafted from root pair i (data tokens on its path)."""
    torch.manual_seed(0)
    head = _perturbed(Eagle3Recipe().build(target, {})).eval()
    g = torch.Generator().manual_seed(1)
    s, steps, i = 14, 4, 6
    ids = torch.randint(0, 320, (1, s), generator=g)
    raw = torch.randn(1, s - 1, 3 * 64, generator=g)
    with torch.no_grad():
        unrolled = ttt_unroll(head, ids, raw, steps)
        lc = head.config.layer
        pool = KVPool(8, KVPool.page_bytes_for(1, lc.num_key_value_heads, lc.head_dim, torch.float32, 8))
        layout = pool.register("eagle3", 1, lc.num_key_value_heads, lc.head_dim, torch.float32)
        kv = SequenceKV(pool, layout)
        kv.reserve(i + 1 + steps)

        def run(feed, hidden):
            inputs = build_inputs([feed], torch.device("cpu"))
            out = head(inputs.input_ids, hidden, inputs.positions, layout.caches[0], inputs.meta)
            kv.num_tokens = feed.start + len(feed.tokens)
            return out

        # Committed pairs 0..i (the root pair last), then one forward per depth re-feeding the chain.
        ctx = run(Feed(kv, ids[0, 1:i + 2].tolist(), 0), head.fuse(raw[0, :i + 1]))
        torch.testing.assert_close(ctx, unrolled[0][0, :i + 1], rtol=1e-5, atol=1e-5)
        outputs = [ctx[-1]]
        for depth in range(1, steps):
            tokens = ids[0, i + 2:i + 2 + depth].tolist()
            out = run(Feed(kv, tokens, i + 1, depths=list(range(depth)),
                           tree_mask=torch.ones(depth, depth, dtype=torch.bool).tril()), torch.stack(outputs))
            torch.testing.assert_close(out[-1], unrolled[depth][0, i], rtol=1e-5, atol=1e-5)
            outputs = [ctx[-1], *out]
        kv.release()


def _batch(target, aux=(), s=20):
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, 320, (2, s), generator=g)
    mask = torch.ones(2, s, dtype=torch.bool)
    mask[1, 12:] = False
    with torch.no_grad():
        out = target.forward_dense(ids, aux_layers=aux)
    return TargetBatch(ids, mask, out.hidden, dict(out.aux_hidden))


@pytest.mark.parametrize("recipe", [EagleRecipe(), Eagle3Recipe()], ids=["eagle", "eagle3"])
def test_gradients_reach_only_the_head_and_the_loss_falls(target, recipe):
    torch.manual_seed(0)
    options = {} if recipe.method == "eagle" else {"ttt_steps": 3}
    head = recipe.build(target, options).train()
    params = recipe.trainable_parameters(head)
    assert params and all(p.requires_grad for p in params)
    assert not any(p is q for p in params for q in target.parameters())  # embeddings / lm_head shared, frozen
    batch = _batch(target, recipe.aux_layers(target.config))
    opt = torch.optim.AdamW(params, lr=1e-2)
    losses = []
    for _ in range(15):
        loss, metrics = recipe.loss(head, target, batch)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    # (the tiny target is nearly uniform, so CE cannot fall far below its start: ask for a clear drop)
    assert all(torch.isfinite(torch.tensor(losses))) and losses[-1] < losses[0] - 0.1, losses
    assert all(p.grad is None for p in target.parameters())
    expected = {"reg", "cls", "acc"} if recipe.method == "eagle" else {f"{m}{j}" for m in ("acc", "loss") for j in range(3)}
    assert set(metrics) == expected


def test_reduced_draft_vocabulary_keeps_the_most_frequent_tokens(target):
    counts = [0.0] * 320
    for rank, tok in enumerate([17, 3, 250, 99, 5]):
        counts[tok] = 100.0 - rank
    head = Eagle3Recipe().build(target, {"draft_vocab_size": 4, "token_counts": counts})
    assert head.lm_head.weight.shape == (4, 64)
    assert head.draft_to_target(torch.arange(4)).tolist() == [3, 17, 99, 250]
    assert head.t2d.nonzero().flatten().tolist() == [3, 17, 99, 250]


@pytest.mark.parametrize("recipe, options, key", [
    (EagleRecipe(), {"bogus": 1}, "eagle.bogus"),
    (EagleRecipe(), {"layers": 2}, "eagle.layers"),
    (EagleRecipe(), {"hidden_size": 32}, "eagle.hidden_size"),
    (EagleRecipe(), {"heads": 3}, "eagle.heads"),
    (EagleRecipe(), {"heads": 4, "kv_heads": 3}, "eagle.kv_heads"),
    (Eagle3Recipe(), {"draft_vocab_size": 100}, "eagle3.token_counts"),
    (Eagle3Recipe(), {"draft_vocab_size": 100, "token_counts": [1.0] * 7}, "eagle3.token_counts"),
    (Eagle3Recipe(), {"draft_vocab_size": 1000}, "eagle3.draft_vocab_size"),
    (Eagle3Recipe(), {"ttt_steps": 0}, "eagle3.ttt_steps"),
])
def test_bad_options_name_the_key(target, recipe, options, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        recipe.build(target, options)


def _dense_eagle3_loss(head, target, batch):
    """EAGLE-3's loss written out over every position (the recipe computes logits only where a loss counts)."""
    import torch.nn.functional as F

    ids, b, t = batch.input_ids, batch.input_ids.shape[0], batch.input_ids.shape[1] - 1
    raw = torch.cat([batch.aux[j] for j in head.config.target_aux_layers], dim=-1)[:, :t]
    logits = target.compute_logits(batch.hidden)
    in_vocab = head.t2d[logits.argmax(-1)]
    p_all = torch.softmax(logits[..., head.t2d], dim=-1)
    total, accs = 0.0, []
    for j, h in enumerate(ttt_unroll(head, ids, raw, head.ttt_steps)):
        valid = torch.zeros(b, t, dtype=torch.bool)
        valid[:, : t - j] = (batch.loss_mask[:, j + 1:] & in_vocab[:, j + 1:])[:, : t - j]
        p = torch.cat([p_all[:, j + 1:], p_all.new_zeros(b, j, p_all.shape[-1])], dim=1)[:, :t]
        logp = F.log_softmax(head.logits(h.reshape(b * t, -1)).view(b, t, -1), dim=-1)
        total = total + 0.8 ** j * ((-(p * logp).sum(-1)) * valid).sum() / valid.sum()
        accs.append((((logp.argmax(-1) == p.argmax(-1)) & valid).sum() / valid.sum()).item())
    return total, accs


def test_eagle3_loss_equals_the_dense_formulation(target):
    torch.manual_seed(1)
    counts = torch.rand(target.config.vocab_size).tolist()
    head = _perturbed(Eagle3Recipe().build(target, {"ttt_steps": 3, "draft_vocab_size": 200, "token_counts": counts}))
    batch = _batch(target, Eagle3Recipe().aux_layers(target.config))
    batch.loss_mask[:, :3] = False  # a prompt: its positions count for nothing
    loss, metrics = Eagle3Recipe().loss(head, target, batch)
    ref, accs = _dense_eagle3_loss(head, target, batch)
    torch.testing.assert_close(loss, ref, rtol=1e-5, atol=1e-6)
    assert [metrics[f"acc{j}"] for j in range(3)] == pytest.approx(accs, abs=1e-6)
