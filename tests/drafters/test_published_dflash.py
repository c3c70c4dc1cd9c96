"""DFlash drafters in z-lab's published layout (``dflash_config``, ``target_layer_ids``, Qwen3 layers with
per-projection tensors, no mask tensor), and the DFlash variants hyspec refuses by name.

A drafter trained here in hyspec's layout, with its mask embedding held at the target's embedding of
``mask_token_id`` (what a z-lab drafter uses), is rewritten in z-lab's layout: both load to the same weights,
and served, both return plain decoding's tokens with the same acceptance.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from hyspec import LLM, SamplingParams
from hyspec.drafters.dflash.checkpoint import load_drafter
from hyspec.drafters.dflash.model import DFlashDrafter
from hyspec.errors import CheckpointError
from hyspec.model.config import ModelConfig
from hyspec.train.registry import resolve_recipe
from tests.drafters.hidden_drafters import target_batch
from tests.model.tiny_checkpoint import make_checkpoint
from tests.spec.conftest import PROMPTS

MASK_ID = 7
GREEDY = SamplingParams(temperature=0, max_tokens=32)
SPEC = {"controller": {"enabled": False, "profile_at_startup": False}, "num_speculative_tokens": 4}


def as_zlab(hyspec_dir: Path, out: Path, mask_token_id: int = MASK_ID, **extra) -> Path:
    """A hyspec-layout DFlash directory rewritten as z-lab publishes one (same weights)."""
    config = json.loads((hyspec_dir / "config.json").read_text())
    section = config.pop("hyspec_drafter")
    layer = ModelConfig.from_dict(config)
    q, kv, inter = layer.num_attention_heads * layer.head_dim, layer.num_key_value_heads * layer.head_dim, \
        layer.intermediate_size
    tensors = {}
    for name, t in load_file(str(hyspec_dir / "model.safetensors")).items():
        if name == "mask_embedding":
            continue  # z-lab embeds mask_token_id with the target's embedding instead
        if ".qkv_proj." in name:
            stem, kind = name.split(".qkv_proj.")
            for part, piece in zip("qkv", t.split([q, kv, kv])):
                tensors[f"{stem}.{part}_proj.{kind}"] = piece.clone()
        elif ".gate_up_proj." in name:
            stem, kind = name.split(".gate_up_proj.")
            gate, up = t.split(inter)
            tensors[f"{stem}.gate_proj.{kind}"], tensors[f"{stem}.up_proj.{kind}"] = gate.clone(), up.clone()
        else:
            tensors[name] = t
    config.update({"architectures": ["DFlashDraftModel"], "block_size": section["block_size"] + 1,
                   "dflash_config": {"mask_token_id": mask_token_id, "target_layer_ids": section["target_layers"]}})
    config.update(extra)
    out.mkdir(parents=True)
    save_file(tensors, str(out / "model.safetensors"))
    (out / "config.json").write_text(json.dumps(config))
    return out


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """(target dir, plain greedy outputs, hyspec-layout drafter dir, z-lab-layout dir of the same weights)."""
    root = tmp_path_factory.mktemp("zlab_dflash")
    target_dir = root / "target"
    make_checkpoint(target_dir, "qwen3", layers=4, seed=0)
    weights = load_file(str(target_dir / "model.safetensors"))
    if "lm_head.weight" in weights:  # clear greedy margins, so a briefly trained drafter gets accepted
        weights["lm_head.weight"] = weights["lm_head.weight"] * 20.0
        save_file(weights, str(target_dir / "model.safetensors"), metadata={"format": "pt"})
    plain = LLM(str(target_dir), dtype="float32", kv_cache_bytes=8 << 20)
    outs = plain.generate(PROMPTS[:4], GREEDY)
    target = plain.engine.model
    recipe = resolve_recipe("dflash")
    torch.manual_seed(0)
    drafter = recipe.build(target, {"layers": 1, "block_size": 4, "teacher_temperature": 0.02})
    with torch.no_grad():
        drafter.mask_embedding.copy_(target.embed_tokens.weight[MASK_ID])
    drafter.mask_embedding.requires_grad_(False)
    batch = target_batch(target, [o.prompt_token_ids + o.outputs[0].token_ids for o in outs],
                         tuple(recipe.aux_layers(target.config)))
    params = [p for p in recipe.trainable_parameters(drafter) if p is not drafter.mask_embedding]
    optimizer = torch.optim.Adam(params, lr=5e-3)
    for _ in range(30):
        loss, _ = recipe.loss(drafter, target, batch)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    own = root / "own"
    recipe.save(drafter.eval(), target_dir, own)
    return target_dir, [o.outputs[0].token_ids for o in outs], own, as_zlab(own, root / "zlab"), target


def _load(path: Path, target) -> DFlashDrafter:
    def build(config, section):
        return DFlashDrafter(config, target.embed_tokens.weight, target.lm_head_weight, ops=target.ops)
    return load_drafter(path, "dflash", target.config, build, torch.float32)


def test_zlab_layout_loads_the_same_weights(trained):
    _, _, own, zlab, target = trained
    mine, theirs = _load(own, target), _load(zlab, target)
    assert theirs.block_size == mine.block_size == 4 and theirs.config.target_layers == mine.config.target_layers
    a, b = mine.state_dict(), theirs.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert torch.equal(theirs.mask_embedding, target.embed_tokens.weight[MASK_ID])


def _rms(x, w, eps=1e-5):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def _rope(x, positions, theta=10000.0):  # x [S, heads, D], HF rotate_half layout
    d = x.shape[-1]
    ang = positions[:, None].float() * (1.0 / theta ** (torch.arange(0, d, 2).float() / d))[None]
    cos, sin = torch.cat([ang.cos()] * 2, -1)[:, None], torch.cat([ang.sin()] * 2, -1)[:, None]
    return x * cos + torch.cat([-x[..., d // 2:], x[..., :d // 2]], -1) * sin


def reference_zlab_block(t, cfg, embed, aux, root, n):
    """z-lab's DFlashDraftModel.forward on one block, written from dflash/model.py over the tensors as stored:
    block [root, mask_token_id x (block_size - 1)] at positions n.., context hidden_norm(fc(aux[:n])) at 0..n-1,
    keys / values of context and block through k/v_proj (k_norm on both), no mask, final norm."""
    heads, kv_heads, d = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    size = cfg["block_size"]
    ctx = _rms(aux[:n] @ t["fc.weight"].T, t["hidden_norm.weight"])
    x = embed[torch.tensor([root] + [cfg["dflash_config"]["mask_token_id"]] * (size - 1))]
    pos_q, pos_k = torch.arange(n, n + size), torch.arange(n + size)
    for i in range(cfg["num_hidden_layers"]):
        p = f"layers.{i}."
        h = _rms(x, t[p + "input_layernorm.weight"])
        both = torch.cat([ctx, h])
        q = _rope(_rms((h @ t[p + "self_attn.q_proj.weight"].T).view(size, heads, d), t[p + "self_attn.q_norm.weight"]),
                  pos_q)
        k = _rope(_rms((both @ t[p + "self_attn.k_proj.weight"].T).view(-1, kv_heads, d),
                       t[p + "self_attn.k_norm.weight"]), pos_k)
        v = (both @ t[p + "self_attn.v_proj.weight"].T).view(-1, kv_heads, d)
        k, v = (z.repeat_interleave(heads // kv_heads, dim=1).transpose(0, 1) for z in (k, v))
        att = torch.nn.functional.scaled_dot_product_attention(q.transpose(0, 1), k, v)
        x = x + att.transpose(0, 1).reshape(size, heads * d) @ t[p + "self_attn.o_proj.weight"].T
        m = _rms(x, t[p + "post_attention_layernorm.weight"])
        x = x + (torch.nn.functional.silu(m @ t[p + "mlp.gate_proj.weight"].T) * (m @ t[p + "mlp.up_proj.weight"].T)) \
            @ t[p + "mlp.down_proj.weight"].T
    return _rms(x, t["norm.weight"])


def test_zlab_drafter_computes_zlabs_block_forward(trained):
    _, _, _, zlab, target = trained
    drafter = _load(zlab, target)
    cfg = json.loads((zlab / "config.json").read_text())
    t = {k: v.float() for k, v in load_file(str(zlab / "model.safetensors")).items()}
    g = torch.Generator().manual_seed(3)
    aux = torch.randn(10, len(cfg["dflash_config"]["target_layer_ids"]) * 64, generator=g)
    with torch.no_grad():
        mine = drafter.forward_train(drafter.context(aux)[None], torch.tensor([[11]]), torch.tensor([[6]]))[0, 0]
    ref = reference_zlab_block(t, cfg, target.embed_tokens.weight, aux, root=11, n=6)
    torch.testing.assert_close(mine, ref, rtol=1e-4, atol=1e-4)


def test_zlab_drafter_serves_plain_tokens_with_the_same_acceptance(trained):
    target_dir, ref, own, zlab, _ = trained
    totals = []
    for path in (own, zlab):
        llm = LLM(str(target_dir), dtype="float32", kv_cache_bytes=8 << 20,
                  speculative_config={**SPEC, "method": "dflash", "model": str(path)})
        assert [o.outputs[0].token_ids for o in llm.generate(PROMPTS[:4], GREEDY)] == ref
        totals.append(llm.engine.spec.metrics.snapshot()["totals"])
        llm.engine.pool.assert_all_free()
    assert totals[0]["accepted_tokens"] > 0, totals[0]
    for key in ("draft_tokens", "accepted_tokens", "accepted_per_position"):
        assert totals[0][key] == totals[1][key], key


@pytest.mark.parametrize("extra, message", [
    ({"architectures": ["DFlash2DraftModel"]}, "DFlash2 drafter"),
    ({"conv_kernel_size": 4}, "DFlash2 drafter"),
    ({"layer_types": ["sliding_attention"], "sliding_window": 8}, "sliding-window DFlash layers"),
    ({"is_causal": True}, "is_causal: True"),
    ({"output_multiplier": 0.5}, "output_multiplier: 0.5"),
    ({"final_logit_softcapping": 30.0}, "final_logit_softcapping: 30.0"),
    ({"speculators_model_type": "dflash", "dflash_config": None}, "speculators 'dflash' checkpoint"),
])
def test_dflash_variants_are_refused_by_name(trained, tmp_path, extra, message):
    _, _, own, _, target = trained
    with pytest.raises(CheckpointError, match=message):
        _load(as_zlab(own, tmp_path / "v", **extra), target)


def test_zlab_drafter_for_another_target_is_refused(trained, tmp_path):
    _, _, own, _, target = trained
    with pytest.raises(CheckpointError, match="mask_token_id 99999 is outside the target's vocabulary"):
        _load(as_zlab(own, tmp_path / "m", mask_token_id=99999), target)
    with pytest.raises(CheckpointError, match="reads the target's last layer"):
        _load(as_zlab(own, tmp_path / "l", dflash_config={"mask_token_id": MASK_ID, "target_layer_ids": [1, 3]}),
              target)
    with pytest.raises(CheckpointError, match="vocab_size is 640, the target's is"):
        _load(as_zlab(own, tmp_path / "v", vocab_size=640), target)
    with pytest.raises(CheckpointError, match="hidden_size is 128, the target's is 64"):
        _load(as_zlab(own, tmp_path / "h", hidden_size=128), target)


def test_zlab_checkpoint_with_unknown_or_missing_tensors_is_refused(trained, tmp_path):
    _, _, own, zlab, target = trained
    tensors = load_file(str(zlab / "model.safetensors"))
    bad = as_zlab(own, tmp_path / "x")
    save_file({**tensors, "layers.0.attention_conv.base_kernel": torch.zeros(2)}, str(bad / "model.safetensors"))
    with pytest.raises(CheckpointError, match="does not use: \\['layers.0.attention_conv.base_kernel'\\]"):
        _load(bad, target)
    save_file({k: v for k, v in tensors.items() if k != "layers.0.self_attn.k_proj.weight"},
              str(bad / "model.safetensors"))
    with pytest.raises(CheckpointError, match="lacks tensor 'layers.0.self_attn.k_proj.weight'"):
        _load(bad, target)
