"""EAGLE / EAGLE-3 heads in the public layouts: load, compare with a reference, round-trip, bad input.

The reference forwards below are written from the public layouts (SafeAILab
``cnets.py``, vLLM ``llama_eagle*.py``): plain torch over the tensors exactly
as a checkpoint names them, independent of hyspec's module and loader.
"""
from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import save_file

from hyspec.drafters.eagle.checkpoint import head_config_dict, load_head, save_head
from hyspec.drafters.eagle.model import EAGLE, EAGLE3, default_aux_layer_ids
from hyspec.drafters.eagle.recipe import Eagle3Recipe, EagleRecipe
from hyspec.errors import CheckpointError
from hyspec.kv.pool import KVPool
from hyspec.kv.sequence_kv import SequenceKV
from hyspec.model.config import ModelConfig
from hyspec.model.llama import CausalLM
from hyspec.seam.forward import Feed, build_inputs

H, HEADS, KV_HEADS, D, I, V, VD, EPS = 64, 4, 2, 16, 136, 320, 200, 1e-5


def tiny_target(hidden: int = H, vocab: int = V, layers: int = 4, seed: int = 0) -> CausalLM:
    cfg = ModelConfig.from_dict({"model_type": "llama", "vocab_size": vocab, "hidden_size": hidden,
                                 "intermediate_size": I, "num_hidden_layers": layers, "num_attention_heads": HEADS,
                                 "num_key_value_heads": KV_HEADS, "rms_norm_eps": EPS,
                                 "max_position_embeddings": 256})
    torch.manual_seed(seed)
    model = CausalLM(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(torch.randn_like(p) * 0.1)
    return model.eval().requires_grad_(False)


def head_config(method: str, **extra) -> dict:
    cfg = {"architectures": ["LlamaForCausalLM" if method == EAGLE else "LlamaForCausalLMEagle3"],
           "model_type": "llama", "hidden_act": "silu", "hidden_size": H, "intermediate_size": I,
           "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS, "num_hidden_layers": 1,
           "vocab_size": V, "rms_norm_eps": EPS, "max_position_embeddings": 256, "rope_theta": 10000.0,
           "torch_dtype": "float32", "tie_word_embeddings": False}
    if method == EAGLE3:
        cfg["draft_vocab_size"] = VD
    return {**cfg, **extra}


def public_tensors(method: str, seed: int = 1) -> dict[str, torch.Tensor]:
    """Random weights under the real names and shapes of the public layouts."""
    g = torch.Generator().manual_seed(seed)

    def w(*shape):
        return torch.randn(*shape, generator=g) * 0.08

    def norm():
        return 1 + torch.randn(H, generator=g) * 0.1

    a = 2 * H if method == EAGLE3 else H  # EAGLE-3's q/k/v read [embedding ; feature]
    p = "layers.0." if method == EAGLE else "midlayer."
    t = {p + "self_attn.q_proj.weight": w(HEADS * D, a), p + "self_attn.k_proj.weight": w(KV_HEADS * D, a),
         p + "self_attn.v_proj.weight": w(KV_HEADS * D, a), p + "self_attn.o_proj.weight": w(H, HEADS * D),
         p + "mlp.gate_proj.weight": w(I, H), p + "mlp.up_proj.weight": w(I, H), p + "mlp.down_proj.weight": w(H, I),
         p + "post_attention_layernorm.weight": norm()}
    if method == EAGLE:
        t.update({"fc.weight": w(H, 2 * H), "fc.bias": w(H)})  # SafeAILab's fc has a bias; no input_layernorm
        return t
    ids = torch.randperm(V, generator=g)[:VD].sort().values
    t2d = torch.zeros(V, dtype=torch.bool)
    t2d[ids] = True
    t.update({"fc.weight": w(H, 3 * H), p + "hidden_norm.weight": norm(), p + "input_layernorm.weight": norm(),
              "norm.weight": norm(), "lm_head.weight": w(VD, H), "d2t": ids - torch.arange(VD), "t2d": t2d})
    return t


def write(path, tensors: dict, config: dict):
    path.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps(config))
    return path


# -- reference forwards -----------------------------------------------------------------------


def _rms(x, w):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS))


def _rope(x, positions):  # x [S, heads, D], HF rotate_half layout, theta 10000
    inv = 1.0 / (10000.0 ** (torch.arange(0, D, 2).float() / D))
    ang = positions[:, None].float() * inv[None]
    cos, sin = torch.cat([ang.cos()] * 2, -1)[:, None], torch.cat([ang.sin()] * 2, -1)[:, None]
    rot = torch.cat([-x[..., D // 2:], x[..., :D // 2]], -1)
    return x * cos + rot * sin


def _layer(t, p, x, residual):
    s = x.shape[0]
    pos = torch.arange(s)
    q = _rope((x @ t[p + "self_attn.q_proj.weight"].T).view(s, HEADS, D), pos)
    k = _rope((x @ t[p + "self_attn.k_proj.weight"].T).view(s, KV_HEADS, D), pos)
    v = (x @ t[p + "self_attn.v_proj.weight"].T).view(s, KV_HEADS, D)
    k, v = (z.repeat_interleave(HEADS // KV_HEADS, dim=1) for z in (k, v))
    att = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), is_causal=True)
    h = residual + att.transpose(0, 1).reshape(s, H) @ t[p + "self_attn.o_proj.weight"].T
    m = _rms(h, t[p + "post_attention_layernorm.weight"])
    gate, up = m @ t[p + "mlp.gate_proj.weight"].T, m @ t[p + "mlp.up_proj.weight"].T
    return h + (F.silu(gate) * up) @ t[p + "mlp.down_proj.weight"].T


def reference_eagle(t, target, ids, feats):  # ids [S] (t_{i+1}), feats [S, H] (f_i) -> logits [S, V]
    x = torch.cat([target.embed_tokens.weight[ids], feats], -1) @ t["fc.weight"].T + t["fc.bias"]
    h = _layer(t, "layers.0.", x, x)  # no input_layernorm in EAGLE's first layer
    return h @ target.lm_head_weight.T


def reference_eagle3(t, target, ids, raw):  # raw [S, 3H] = [low ; mid ; high] -> logits over target ids [S, V]
    f = raw @ t["fc.weight"].T
    e = _rms(target.embed_tokens.weight[ids], t["midlayer.input_layernorm.weight"])
    x = torch.cat([e, _rms(f, t["midlayer.hidden_norm.weight"])], -1)
    h = _layer(t, "midlayer.", x, f)
    draft = _rms(h, t["norm.weight"]) @ t["lm_head.weight"].T  # [S, VD]
    out = torch.full((ids.shape[0], V), float("-inf"))
    out[:, torch.arange(VD) + t["d2t"]] = draft
    return out


def head_logits_over_target(head, h):  # [S, V] with -inf outside the draft vocabulary
    d = head.logits(h)
    out = torch.full((h.shape[0], V), float("-inf"))
    out[:, head.draft_to_target(torch.arange(d.shape[1]))] = d
    return out


@pytest.fixture(scope="module")
def target():
    return tiny_target()


def _inputs(seed=2, s=12, width=H):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, V, (s,), generator=g), torch.randn(s, width, generator=g)


@pytest.mark.parametrize("model_prefix", ["", "model."])
def test_eagle_public_layout_matches_reference(tmp_path, target, model_prefix):
    t = public_tensors(EAGLE)
    path = write(tmp_path / "eagle", {model_prefix + k: v for k, v in t.items()}, head_config(EAGLE))
    head = load_head(path, target, EAGLE)
    assert head.layer.input_layernorm is None and head.fc.bias is not None
    ids, feats = _inputs()
    h = head.forward_dense(ids[None], feats[None])[0]
    torch.testing.assert_close(head.logits(h), reference_eagle(t, target, ids, feats), rtol=1e-4, atol=1e-4)


def test_eagle3_public_layout_matches_reference(tmp_path, target):
    t = public_tensors(EAGLE3)
    path = write(tmp_path / "eagle3", t, head_config(EAGLE3))
    head = load_head(path, target, EAGLE3)
    assert head.config.aux_layer_ids == default_aux_layer_ids(4) == (1, 2, 2)  # (2, L//2, L-3) clamped
    assert head.config.target_aux_layers == (0, 1, 1)
    ids, raw = _inputs(width=3 * H)
    h = head.forward_dense(ids[None], head.fuse(raw)[None])[0]
    torch.testing.assert_close(head_logits_over_target(head, h), reference_eagle3(t, target, ids, raw),
                               rtol=1e-4, atol=1e-4)
    assert torch.equal(head.t2d, t["t2d"])


def _paged(head, ids, hidden, positions=None):
    """The serving path: one causal feed through a pool page table."""
    lc = head.config.layer
    pool = KVPool(8, KVPool.page_bytes_for(1, lc.num_key_value_heads, lc.head_dim, torch.float32, 4))
    layout = pool.register("head", 1, lc.num_key_value_heads, lc.head_dim, torch.float32)
    kv = SequenceKV(pool, layout)
    kv.reserve(len(ids))
    inputs = build_inputs([Feed(kv, ids.tolist(), 0)], torch.device("cpu"))
    out = head(inputs.input_ids, hidden, inputs.positions, layout.caches[0], inputs.meta)
    kv.release()
    pool.check_invariants()
    return out


@pytest.mark.parametrize("method", [EAGLE, EAGLE3])
def test_round_trip_gives_identical_outputs(tmp_path, target, method):
    recipe = EagleRecipe() if method == EAGLE else Eagle3Recipe()
    options = {} if method == EAGLE else {"draft_vocab_size": VD, "token_counts": torch.rand(V).tolist()}
    built = recipe.build(target, options).eval()
    with torch.no_grad():  # norms away from 1 so a swapped norm would show
        for name, p in built.named_parameters():
            if "norm" in name:
                p.add_(torch.randn_like(p) * 0.1)
    recipe.save(built, tmp_path, tmp_path / method)
    config = json.loads((tmp_path / method / "config.json").read_text())
    assert config == head_config_dict(built)
    assert config["architectures"] == [{"eagle": "LlamaForCausalLMEagle", "eagle3": "LlamaForCausalLMEagle3"}[method]]
    loaded = load_head(tmp_path / method, target, method)
    ids, feats = _inputs(width=built.config.feature_size)
    with torch.no_grad():
        a = built.forward_dense(ids[None], built.fuse(feats)[None])[0]
        b = loaded.forward_dense(ids[None], loaded.fuse(feats)[None])[0]
        assert torch.equal(a, b)
        assert torch.equal(built.logits(a), loaded.logits(b))
        assert torch.equal(built.draft_to_target(torch.arange(built.config.draft_vocab_size)),
                           loaded.draft_to_target(torch.arange(loaded.config.draft_vocab_size)))
        torch.testing.assert_close(_paged(loaded, ids, loaded.fuse(feats)), b, rtol=1e-5, atol=1e-5)
    if method == EAGLE3:
        assert config["draft_vocab_size"] == VD and config["eagle_aux_hidden_state_layer_ids"] == [1, 2, 2]


# -- bad input --------------------------------------------------------------------------------


def test_head_for_another_hidden_size_is_rejected(tmp_path):
    path = write(tmp_path / "h", public_tensors(EAGLE), head_config(EAGLE))
    with pytest.raises(CheckpointError, match="hidden size 64; this target has 32"):
        load_head(path, tiny_target(hidden=32), EAGLE)


@pytest.mark.parametrize("method", [EAGLE, EAGLE3])
def test_head_for_another_vocabulary_is_rejected(tmp_path, method):
    path = write(tmp_path / "v", public_tensors(method), head_config(method))
    with pytest.raises(CheckpointError, match="vocab_size 320; this target has 300"):
        load_head(path, tiny_target(vocab=300), method)


def test_eagle3_head_for_a_target_of_another_width_is_rejected(tmp_path, target):
    path = write(tmp_path / "w", public_tensors(EAGLE3), head_config(EAGLE3, target_hidden_size=96))
    with pytest.raises(CheckpointError, match="hidden size 96; this target has 64"):
        load_head(path, target, EAGLE3)


def test_layout_and_method_must_agree(tmp_path, target):
    path = write(tmp_path / "e3", public_tensors(EAGLE3), head_config(EAGLE3))
    with pytest.raises(CheckpointError, match="use method 'eagle3'"):
        load_head(path, target, EAGLE)
    path = write(tmp_path / "e1", public_tensors(EAGLE), head_config(EAGLE))
    with pytest.raises(CheckpointError, match="use method 'eagle'"):
        load_head(path, target, EAGLE3)


@pytest.mark.parametrize("damage", ["garbage", "truncated"])
def test_corrupt_weights_are_rejected(tmp_path, target, damage):
    path = write(tmp_path / damage, public_tensors(EAGLE), head_config(EAGLE))
    f = path / "model.safetensors"
    data = f.read_bytes()
    f.write_bytes(b"\x00garbage" * 64 if damage == "garbage" else data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="corrupt|truncated|cannot be read"):
        load_head(path, target, EAGLE)


def test_corrupt_config_and_missing_files_are_rejected(tmp_path, target):
    path = write(tmp_path / "c", public_tensors(EAGLE), head_config(EAGLE))
    (path / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="not valid JSON"):
        load_head(path, target, EAGLE)
    (path / "config.json").unlink()
    with pytest.raises(CheckpointError, match="config.json"):
        load_head(path, target, EAGLE)
    with pytest.raises(CheckpointError, match="does not exist"):
        load_head(tmp_path / "nowhere", target, EAGLE)


def test_missing_or_damaged_tensors_are_rejected(tmp_path, target):
    t = public_tensors(EAGLE)
    del t["layers.0.mlp.up_proj.weight"]
    with pytest.raises(CheckpointError, match="up_proj.weight.*missing"):
        load_head(write(tmp_path / "m", t, head_config(EAGLE)), target, EAGLE)
    t = public_tensors(EAGLE)
    t["layers.0.self_attn.o_proj.weight"][0, 0] = float("nan")
    with pytest.raises(CheckpointError, match="NaN"):
        load_head(write(tmp_path / "n", t, head_config(EAGLE)), target, EAGLE)
    t = public_tensors(EAGLE3)
    t["d2t"][-1] = V  # maps past the vocabulary
    with pytest.raises(CheckpointError, match="d2t"):
        load_head(write(tmp_path / "d", t, head_config(EAGLE3)), target, EAGLE3)
    t = public_tensors(EAGLE3)
    t["t2d"] = ~t["t2d"]
    with pytest.raises(CheckpointError, match="t2d disagrees"):
        load_head(write(tmp_path / "t", t, head_config(EAGLE3)), target, EAGLE3)
