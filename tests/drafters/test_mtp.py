"""MTP: DeepSeek-layout and separate checkpoints round trip, greedy identity (random and trained modules), bad input."""
from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from hyspec.drafters.mtp.checkpoint import load_mtp, save_deepseek_layout, save_mtp
from hyspec.drafters.mtp.model import MTPConfig, MTPDrafter
from hyspec.errors import CheckpointError
from hyspec.model.loader import load_model
from hyspec.ops.norm import rms_norm
from tests.drafters.hidden_drafters import (  # noqa: F401  (fixtures)
    GREEDY, assert_clean_pool, generate_in_batches, plain, reclaim_before, spec_llm, target_dir, totals,
    train_drafter)

MODULES = 2


def random_mtp(target, num_modules: int = MODULES, seed: int = 1) -> MTPDrafter:
    """MTP modules with random weights (norms and biases perturbed so that every tensor matters)."""
    torch.manual_seed(seed)
    drafter = MTPDrafter(MTPConfig(target.config, num_modules), target.embed_tokens.weight, target.lm_head_weight,
                         ops=target.ops)
    with torch.no_grad():
        for name, p in drafter.named_parameters():
            if "norm" in name:
                p.add_(torch.randn_like(p) * 0.1)
    return drafter.eval()


def module_outputs(drafter: MTPDrafter, seed: int = 3) -> list[torch.Tensor]:
    """Every module's output hidden states and logits on fixed random inputs (the chain, teacher-forced)."""
    g = torch.Generator().manual_seed(seed)
    cfg = drafter.config.block
    ids = torch.randint(0, cfg.vocab_size, (2, 12), generator=g)
    x = torch.randn(2, 12, cfg.hidden_size, generator=g)
    outs = []
    with torch.no_grad():
        for m in range(drafter.num_modules):
            x = drafter.forward_dense(m, ids, x)
            outs += [x, drafter.logits(m, x)]
    return outs


@pytest.fixture(scope="module")
def target(target_dir):
    return load_model(target_dir, dtype="float32")


@pytest.fixture(scope="module")
def deepseek_dir(target_dir, target, tmp_path_factory):
    """The tiny target with two random MTP modules appended in DeepSeek's layout."""
    out = tmp_path_factory.mktemp("deepseek_layout")
    save_deepseek_layout(random_mtp(target), target_dir, out)
    return out


@pytest.fixture(scope="module")
def trained_dir(target_dir, plain, tmp_path_factory):
    out = tmp_path_factory.mktemp("mtp_trained")
    metrics = train_drafter("mtp", target_dir, out, plain["sequences"], steps=250, options={"num_modules": MODULES})
    assert metrics["top1_module0"] > 0.85 and metrics["top1_module1"] > 0.85, metrics
    return out


def test_deepseek_layout_has_the_real_names_and_loads_identically(target_dir, target, deepseek_dir):
    N, H, V = target.config.num_hidden_layers, target.config.hidden_size, target.config.vocab_size
    config = json.loads((deepseek_dir / "config.json").read_text())
    assert config["num_nextn_predict_layers"] == MODULES and config["num_hidden_layers"] == N
    weight_map = json.loads((deepseek_dir / "model.safetensors.index.json").read_text())["weight_map"]
    from safetensors import safe_open

    shapes = {}
    for name, file in weight_map.items():
        with safe_open(str(deepseek_dir / file), framework="pt") as f:
            shapes[name] = tuple(f.get_slice(name).get_shape())
    for i in range(MODULES):
        p = f"model.layers.{N + i}."
        assert shapes[p + "enorm.weight"] == shapes[p + "hnorm.weight"] == shapes[p + "shared_head.norm.weight"] == (H,)
        assert shapes[p + "eh_proj.weight"] == (H, 2 * H)
        assert shapes[p + "shared_head.head.weight"] == shapes[p + "embed_tokens.weight"] == (V, H)
        for name in ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
                     "self_attn.o_proj.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight",
                     "input_layernorm.weight", "post_attention_layernorm.weight"):
            assert p + name in shapes
    original = random_mtp(target)
    loaded = load_mtp(deepseek_dir, target.config, target.embed_tokens.weight, target.lm_head_weight, torch.float32)
    for a, b in zip(module_outputs(original), module_outputs(loaded)):
        assert torch.equal(a, b)
    # eh_proj reads [enorm(embedding) ; hnorm(hidden)] in that order (checked from the raw tensors).
    with safe_open(str(deepseek_dir / weight_map[f"model.layers.{N}.eh_proj.weight"]), framework="pt") as f:
        raw = {n: f.get_tensor(n) for n in (f"model.layers.{N}.{x}" for x in ("eh_proj.weight", "enorm.weight",
                                                                              "hnorm.weight"))}
    ids, h = torch.tensor([[5, 9]]), torch.randn(1, 2, H)
    emb = target.embed_tokens.weight[ids]
    manual = torch.cat([rms_norm(emb, raw[f"model.layers.{N}.enorm.weight"], 1e-5),
                        rms_norm(h, raw[f"model.layers.{N}.hnorm.weight"], 1e-5)], -1) @ raw[
        f"model.layers.{N}.eh_proj.weight"].T
    is_first = torch.tensor([[False, False]])
    assert torch.allclose(loaded._combine(0, ids, h, is_first), manual, atol=1e-6)
    # The target part of the directory is the target, untouched.
    same = load_model(deepseek_dir, dtype="float32")
    probe = torch.tensor([[1, 7, 42, 3]])
    assert torch.equal(same.forward_dense(probe).hidden, target.forward_dense(probe).hidden)


def test_separate_checkpoint_round_trip(target, tmp_path):
    original = random_mtp(target, num_modules=1, seed=5)
    save_mtp(original, tmp_path)
    loaded = load_mtp(tmp_path, target.config, target.embed_tokens.weight, target.lm_head_weight, torch.float32)
    assert loaded.num_modules == 1
    for a, b in zip(module_outputs(original), module_outputs(loaded)):
        assert torch.equal(a, b)


@pytest.mark.parametrize("batch", [1, 8])
def test_random_modules_from_the_target_checkpoint_are_identical_to_plain(deepseek_dir, plain, batch):
    """No ``model``: the modules come from the target's own checkpoint (DeepSeek layout)."""
    count = 3 if batch == 1 else 8  # random modules accept little: one token per step is slow at batch 1
    llm = spec_llm(deepseek_dir, {"method": "mtp", "num_speculative_tokens": 3})
    assert generate_in_batches(llm, batch, count) == plain["outputs"][:count]
    assert totals(llm)["draft_tokens"] > 0
    assert_clean_pool(llm)


@pytest.mark.parametrize("batch", [1, 8])
def test_trained_modules_are_identical_to_plain_with_long_accepted_chains(target_dir, trained_dir, plain, batch):
    llm = spec_llm(target_dir, {"method": "mtp", "model": str(trained_dir), "num_speculative_tokens": 4})
    assert generate_in_batches(llm, batch) == plain["outputs"]
    t = totals(llm)
    assert t["accepted_tokens"] > 0.7 * t["draft_tokens"], t
    # Depth 3 and 4 come from reusing the last of the two modules; all four accepted = a bonus token too.
    assert t["accepted_per_position"][3] > 0, t
    assert_clean_pool(llm)


def test_drafter_catches_up_after_idle_steps_and_restarts_after_a_reclaim(target_dir, trained_dir, plain):
    """Idle steps (another method drafting) are caught up lazily; a reclaimed sequence restarts its draft
    state at the next committed position (KV index 0 = offset)."""
    llm = spec_llm(target_dir, {"method": "mtp", "model": str(trained_dir), "num_speculative_tokens": 4})
    calls = reclaim_before(llm, "mtp", (3, 6), idle_every=2)
    assert generate_in_batches(llm, 8) == plain["outputs"]
    assert calls["reclaimed"] == 2 and calls["max_offset"] > 0, calls
    assert totals(llm)["accepted_tokens"] > 0
    assert_clean_pool(llm)


def test_sampled_requests_are_reproducible(target_dir, trained_dir):
    from hyspec import SamplingParams

    # ignore_eos: whether a sampled path meets EOS within 24 tokens depends on the CPU's rounding (it did
    # on AMD Zen 5); the test is about reproducibility, so every request runs its 24 tokens
    params = SamplingParams(temperature=0.8, top_p=0.9, seed=11, max_tokens=24, ignore_eos=True)
    llm = spec_llm(target_dir, {"method": "mtp", "model": str(trained_dir), "num_speculative_tokens": 4})
    first = [o.outputs[0].token_ids for o in llm.generate(["def add(a, b):", "x = ["], params)]
    again = [o.outputs[0].token_ids for o in llm.generate(["def add(a, b):", "x = ["], params)]
    assert first == again and all(len(t) == 24 for t in first)
    t = totals(llm)
    assert t["draft_tokens"] > 0 and "draft_unavailable" not in t["rejections"], t
    assert_clean_pool(llm)


def _foreign(target, tmp_path, **change):
    cfg = dataclasses.replace(target.config, **change)
    embed = torch.randn(cfg.vocab_size, cfg.hidden_size)
    save_mtp(MTPDrafter(MTPConfig(cfg, 1), embed, embed), tmp_path)
    return tmp_path


@pytest.mark.parametrize("change, key", [({"hidden_size": 32}, "hidden_size"), ({"vocab_size": 300}, "vocab_size")])
def test_a_drafter_for_another_target_is_rejected(target, tmp_path, change, key):
    path = _foreign(target, tmp_path, **change)
    with pytest.raises(CheckpointError, match=f"another target: its {key}"):
        load_mtp(path, target.config, target.embed_tokens.weight, target.lm_head_weight, torch.float32)


def test_corrupt_or_incomplete_checkpoints_are_rejected(target_dir, target, tmp_path):
    good = tmp_path / "good"
    save_mtp(random_mtp(target, num_modules=1), good)
    args = (target.config, target.embed_tokens.weight, target.lm_head_weight, torch.float32)
    truncated = tmp_path / "truncated"
    truncated.mkdir()
    (truncated / "config.json").write_text((good / "config.json").read_text())
    (truncated / "model.safetensors").write_bytes((good / "model.safetensors").read_bytes()[:1000])
    with pytest.raises(CheckpointError, match="corrupt or truncated"):
        load_mtp(truncated, *args)
    unfinished = tmp_path / "unfinished"
    unfinished.mkdir()
    (unfinished / "model.safetensors").write_bytes((good / "model.safetensors").read_bytes())
    with pytest.raises(CheckpointError, match="config.json"):
        load_mtp(unfinished, *args)
    with pytest.raises(CheckpointError, match="no MTP modules"):
        load_mtp(target_dir, *args)  # a plain target: no num_nextn_predict_layers
    with pytest.raises(CheckpointError, match="no MTP modules"):
        spec_llm(target_dir, {"method": "mtp", "model": str(target_dir)})


def test_a_static_token_tree_is_refused(deepseek_dir):
    from hyspec.errors import ConfigError

    with pytest.raises(ConfigError, match="speculative_token_tree"):
        spec_llm(deepseek_dir, {"method": "mtp", "speculative_token_tree": "[(0,), (1,), (0, 0)]"})
