"""DFlash: checkpoint round trip, paged block == dense block, greedy identity, losslessness at T > 0, bad input."""
from __future__ import annotations

import dataclasses
import json
from types import SimpleNamespace

import pytest
import torch

from hyspec.drafters.dflash.checkpoint import load_drafter, save_drafter
from hyspec.drafters.dflash.model import DFlashConfig, DFlashDrafter, default_target_layers
from hyspec.drafters.dflash.proposer import DFlashProposer, sample_block
from hyspec.errors import CheckpointError
from hyspec.kv.pool import KVPool
from hyspec.model.loader import load_model
from hyspec.ops import reference_ops
from hyspec.ops.sampling import SamplingTensors
from hyspec.seam.proposer import CommittedHidden, DraftRequest
from hyspec.seam.target import TargetContext
from tests.drafters.hidden_drafters import (  # noqa: F401  (fixtures)
    assert_clean_pool, decode_chains, generate_in_batches, plain, reclaim_before, spec_llm, target_dir,
    totals, train_drafter)

BLOCK = 4


@pytest.fixture(scope="module")
def target(target_dir):
    return load_model(target_dir, dtype="float32")


def random_dflash(target, layers: int = 2, seed: int = 1, target_layers=None) -> DFlashDrafter:
    torch.manual_seed(seed)
    cfg = DFlashConfig(dataclasses.replace(target.config, num_hidden_layers=layers),
                       target_layers or default_target_layers(target.config.num_hidden_layers), BLOCK)
    drafter = DFlashDrafter(cfg, target.embed_tokens.weight, target.lm_head_weight, max_positions=256)
    with torch.no_grad():
        for name, p in drafter.named_parameters():
            if "norm" in name:
                p.add_(torch.randn_like(p) * 0.1)
    return drafter.eval()


def _build(target):
    return lambda config, section: DFlashDrafter(config, target.embed_tokens.weight, target.lm_head_weight,
                                                 max_positions=256)


def _features(target, ids: torch.Tensor, layers):
    with torch.no_grad():
        out = target.forward_dense(ids[None], aux_layers=tuple(layers))
    return out.hidden[0], {layer: h[0] for layer, h in out.aux_hidden.items()}


@pytest.fixture(scope="module")
def trained_dir(target_dir, plain, tmp_path_factory):
    out = tmp_path_factory.mktemp("dflash_trained")
    metrics = train_drafter("dflash", target_dir, out, plain["sequences"], steps=200,
                            options={"block_size": BLOCK, "layers": 1, "anchors": 48})
    assert metrics["accepted_len"] > 2.5, metrics
    return out


def test_checkpoint_round_trip(target, tmp_path):
    original = random_dflash(target)
    save_drafter(original, "dflash", original.config, target.config, tmp_path)
    section = json.loads((tmp_path / "config.json").read_text())["hyspec_drafter"]
    assert section["target_layers"] == list(original.config.target_layers) and section["block_size"] == BLOCK
    loaded = load_drafter(tmp_path, "dflash", target.config, _build(target), torch.float32)
    g = torch.Generator().manual_seed(0)
    context = torch.randn(2, 10, target.config.hidden_size, generator=g)
    roots = torch.randint(0, 320, (2, 3), generator=g)
    anchors = torch.tensor([[0, 4, 9], [2, 3, 8]])
    with torch.no_grad():
        a, b = original.forward_train(context, roots, anchors), loaded.forward_train(context, roots, anchors)
    assert torch.equal(a, b) and torch.equal(original.logits(a), loaded.logits(b))


def test_paged_blocks_over_the_cached_context_equal_the_dense_blocks(target):
    """The proposer's pool path (context K/V absorbed lazily, block dropped after use) is the training maths."""
    drafter = random_dflash(target)
    cfg = drafter.config.layers
    pool = KVPool(64, KVPool.page_bytes_for(cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim,
                                            torch.float32, 16))
    backend = SimpleNamespace(ops=reference_ops(), device=torch.device("cpu"))  # what a proposer reads of one
    context = TargetContext(backend=backend, pool=pool, vocab_size=target.config.vocab_size, max_model_len=256,
                            dtype=torch.float32, model=target)
    proposer = DFlashProposer(context, drafter, BLOCK)
    captured = {}
    inner = proposer.select
    proposer.select = lambda live, hidden, sampling: captured.setdefault("h", []).append(hidden) or inner(
        live, hidden, sampling)
    ids = torch.randint(3, 320, (30,), generator=torch.Generator().manual_seed(2))
    final, aux = _features(target, ids, drafter.config.target_layers)
    seq = SimpleNamespace(request_id="r", token_ids=[], params=SimpleNamespace(greedy=True), generator=None)
    committed = 0
    for n in (11, 12, 19, 27):  # root = ids[n]; the target has hidden states for ids[:n]
        for start, stop in ((committed, (committed + n) // 2), ((committed + n) // 2, n)):  # two chunks
            if stop > start:
                proposer.on_commit(seq, CommittedHidden(start, final[start:stop],
                                                        {layer: h[start:stop] for layer, h in aux.items()}))
        committed = n
        seq.token_ids = ids[:n + 1].tolist()
        seq.last_token = seq.token_ids[-1]
        tree = proposer.propose([DraftRequest(seq, BLOCK)], SamplingTensors.from_lists([0.0]))[0]
        context = drafter.context(torch.cat([aux[layer] for layer in drafter.config.target_layers], -1))
        dense = drafter.forward_train(context[None], ids[n].view(1, 1), torch.tensor([[n]]))[0, 0]
        assert torch.allclose(captured["h"][-1][0], dense, atol=1e-5)
        assert tree.tokens[1:].tolist() == drafter.logits(dense[1:]).argmax(-1).tolist()
        st = proposer.states.get("r")
        assert st.kv.num_tokens == n and len(st.pending) == 0  # the block's entries were dropped again
    proposer.on_finish(seq)
    pool.check_invariants()
    assert pool.num_free == pool.num_pages


@pytest.mark.parametrize("batch", [1, 8])
def test_random_drafter_is_identical_to_plain(target, target_dir, plain, tmp_path, batch):
    drafter = random_dflash(target)
    save_drafter(drafter, "dflash", drafter.config, target.config, tmp_path)
    count = 3 if batch == 1 else 8
    llm = spec_llm(target_dir, {"method": "dflash", "model": str(tmp_path), "num_speculative_tokens": BLOCK})
    assert generate_in_batches(llm, batch, count) == plain["outputs"][:count]
    assert totals(llm)["draft_tokens"] > 0
    assert_clean_pool(llm)


@pytest.mark.parametrize("batch", [1, 8])
def test_trained_drafter_is_identical_to_plain_with_long_accepted_blocks(target_dir, trained_dir, plain, batch):
    llm = spec_llm(target_dir, {"method": "dflash", "model": str(trained_dir), "num_speculative_tokens": BLOCK})
    assert generate_in_batches(llm, batch) == plain["outputs"]
    t = totals(llm)
    assert t["accepted_tokens"] > 0.7 * t["draft_tokens"], t
    assert t["accepted_per_position"][BLOCK - 1] > 0, t  # whole blocks accepted: a bonus token each time
    assert_clean_pool(llm)


def test_drafter_catches_up_after_idle_steps_and_restarts_after_a_reclaim(target_dir, trained_dir, plain):
    """Idle steps (another method drafting) are caught up lazily; a reclaimed sequence restarts its draft
    state at the next committed position (KV index 0 = offset)."""
    llm = spec_llm(target_dir, {"method": "dflash", "model": str(trained_dir), "num_speculative_tokens": 4})
    calls = reclaim_before(llm, "dflash", (3, 6), idle_every=2)
    assert generate_in_batches(llm, 8) == plain["outputs"]
    assert calls["reclaimed"] == 2 and calls["max_offset"] > 0, calls
    assert totals(llm)["accepted_tokens"] > 0
    assert_clean_pool(llm)


def test_sampled_requests_draft_valid_q_and_are_reproducible(target_dir, trained_dir):
    from hyspec import SamplingParams

    params = SamplingParams(temperature=0.8, top_k=40, top_p=0.9, seed=11, max_tokens=24)
    llm = spec_llm(target_dir, {"method": "dflash", "model": str(trained_dir), "num_speculative_tokens": BLOCK})
    first = [o.outputs[0].token_ids for o in llm.generate(["def add(a, b):", "x = ["], params)]
    again = [o.outputs[0].token_ids for o in llm.generate(["def add(a, b):", "x = ["], params)]
    assert first == again and all(len(t) == 24 for t in first)
    t = totals(llm)
    assert t["draft_tokens"] > 0 and "draft_unavailable" not in t["rejections"], t  # every q row passed the checks
    assert_clean_pool(llm)


def test_sampled_chains_emit_the_target_distribution():
    """A toy block drafter (slot j's logits depend on the position and root only) through sample_block + verify.

    200,000 sequences, checked exactly like tests/test_verify_stats.py (which shows the check catches a 1%
    shift): the joint law of the first two tokens and the marginals of the first three.
    """
    from tests.test_verify_stats import PARAMS, VOCAB, ToyModels, failures

    models = ToyModels(seed=11)
    g = torch.Generator().manual_seed(12)
    levels = models.target_logits.shape[0]
    # draft_table[pos, root, j] = logits of slot j+1: near the target's law at pos+j (but blind to slots < j).
    draft_table = torch.stack([models.target_logits[(torch.arange(levels) + j).clamp(max=levels - 1)]
                               for j in range(3)], dim=2) + torch.randn(levels, VOCAB, 3, VOCAB, generator=g)

    def draft(pos, root, sampling, uniforms):
        tokens, q = sample_block(draft_table[pos, root], sampling, uniforms, reference_ops())
        return tokens, q, torch.full_like(pos, 3)

    n = 200_000
    sampling = SamplingTensors.from_lists([PARAMS["temperature"]] * n, [PARAMS["top_k"]] * n,
                                          [PARAMS["top_p"]] * n, [PARAMS["min_p"]] * n)
    samples = decode_chains(models, draft, sampling, seed=13, num_seqs=n, length=3, block=3)
    assert failures(samples, models.exact()) == []


@pytest.mark.parametrize("change, message", [
    ({"hidden_size": 32}, "another target: its hidden_size"),
    ({"vocab_size": 300}, "another target: its vocab_size"),
])
def test_a_drafter_for_another_target_is_rejected(target, target_dir, tmp_path, change, message):
    cfg = dataclasses.replace(target.config, num_hidden_layers=1, **change)
    embed = torch.randn(cfg.vocab_size, cfg.hidden_size)
    foreign = DFlashDrafter(DFlashConfig(cfg, (0, 1), BLOCK), embed, embed)
    save_drafter(foreign, "dflash", foreign.config, cfg, tmp_path)
    with pytest.raises(CheckpointError, match=message):
        spec_llm(target_dir, {"method": "dflash", "model": str(tmp_path)})


def test_bad_checkpoints_are_rejected(target, tmp_path):
    deep = random_dflash(target, target_layers=(0, 5))  # reads a layer the 2-layer target lacks
    save_drafter(deep, "dflash", deep.config, target.config, tmp_path / "deep")
    with pytest.raises(CheckpointError, match=r"reads target layers \[5\]"):
        load_drafter(tmp_path / "deep", "dflash", target.config, _build(target), torch.float32)
    good = tmp_path / "good"
    drafter = random_dflash(target)
    save_drafter(drafter, "dflash", drafter.config, target.config, good)
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text((good / "config.json").read_text())
    (broken / "model.safetensors").write_bytes((good / "model.safetensors").read_bytes()[:2000])
    with pytest.raises(CheckpointError, match="corrupt or truncated"):
        load_drafter(broken, "dflash", target.config, _build(target), torch.float32)
    with pytest.raises(CheckpointError, match="not a dspark drafter"):
        load_drafter(good, "dspark", target.config, _build(target), torch.float32)
    (good / "config.json").unlink()  # what an interrupted save leaves
    with pytest.raises(CheckpointError, match="config.json not found"):
        load_drafter(good, "dflash", target.config, _build(target), torch.float32)
