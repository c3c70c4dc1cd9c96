"""EAGLE-3 heads as vllm-project/speculators publishes them, and the EAGLE-3 variants hyspec refuses by name
(multi-layer and fc-less heads, which load: test_eagle3_vllm_variants.py).

A speculators checkpoint (``speculators_model_type: eagle3``, the layer's config under
``transformer_layer_config``, the first layer as ``layers.0.*`` with a copy of the verifier's
``embed_tokens``) is built here from the same weights as a SafeAILab-layout head (``midlayer.*``): both
load to the same head, and served, both return plain decoding's tokens with the same acceptance.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from hyspec import LLM, SamplingParams
from hyspec.drafters.eagle.checkpoint import load_head
from hyspec.drafters.eagle.model import EAGLE, EAGLE3
from hyspec.drafters.eagle.recipe import Eagle3Recipe
from hyspec.errors import CheckpointError
from tests.drafters.test_eagle_checkpoint import (H, V, head_config, head_logits_over_target, public_tensors,
                                                  reference_eagle3, tiny_target, write)
from tests.drafters.test_eagle_identity import _batch
from tests.model.tiny_checkpoint import make_checkpoint
from tests.spec.conftest import PROMPTS

_LAYER_KEYS_OUT = ("architectures", "draft_vocab_size", "target_hidden_size", "norm_before_residual",
                   "eagle_aux_hidden_state_layer_ids", "eagle_config")


def speculators_config(safeailab: dict, **extra) -> dict:
    """A SafeAILab / hyspec EAGLE-3 config.json rewritten as speculators writes its Eagle3SpeculatorConfig."""
    layer = {k: v for k, v in safeailab.items() if k not in _LAYER_KEYS_OUT}
    cfg = {"architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3",
           "transformer_layer_config": layer, "draft_vocab_size": safeailab.get("draft_vocab_size", V),
           "norm_before_residual": safeailab.get("norm_before_residual", False),
           "speculators_config": {"algorithm": "eagle3", "default_proposal_method": "greedy",
                                  "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3}],
                                  "verifier": {"name_or_path": "tiny", "architectures": ["LlamaForCausalLM"]}}}
    for key in ("target_hidden_size", "eagle_aux_hidden_state_layer_ids"):
        if safeailab.get(key) is not None:
            cfg[key] = safeailab[key]
    return {**cfg, **extra}


def speculators_tensors(safeailab: dict[str, torch.Tensor], embed: torch.Tensor | None = None) -> dict:
    out = {k.replace("midlayer.", "layers.0."): v for k, v in safeailab.items()}
    if embed is not None:
        out["embed_tokens.weight"] = embed.clone()  # speculators saves the verifier's embedding with the head
    return out


@pytest.fixture(scope="module")
def target():
    return tiny_target()


def test_speculators_layout_loads_as_the_safeailab_layout(tmp_path, target):
    t = public_tensors(EAGLE3)
    cfg = head_config(EAGLE3)
    spec = write(tmp_path / "spec", speculators_tensors(t, target.embed_tokens.weight), speculators_config(cfg))
    head = load_head(spec, target, EAGLE3)
    assert head.embed_tokens is None  # the verifier's copy: the target's embedding is shared
    g = torch.Generator().manual_seed(2)
    ids, raw = torch.randint(0, V, (12,), generator=g), torch.randn(12, 3 * H, generator=g)
    h = head.forward_dense(ids[None], head.fuse(raw)[None])[0]
    torch.testing.assert_close(head_logits_over_target(head, h), reference_eagle3(t, target, ids, raw),
                               rtol=1e-4, atol=1e-4)
    with pytest.raises(CheckpointError, match="EAGLE-3 head.*use method 'eagle3'"):
        load_head(spec, target, EAGLE)  # no longer taken for an EAGLE-1/2 head


def test_speculators_head_with_its_own_embeddings_uses_them(tmp_path, target):
    t = public_tensors(EAGLE3)
    own = target.embed_tokens.weight + 0.01
    head = load_head(write(tmp_path / "own", speculators_tensors(t, own), speculators_config(head_config(EAGLE3))),
                     target, EAGLE3)
    assert head.embed_tokens is not None and torch.equal(head.embed_tokens.weight, own)


def test_speculators_qwen3_layer_reads_its_qk_norms(tmp_path):
    target = tiny_target()
    t = public_tensors(EAGLE3)
    norms = {f"layers.0.self_attn.{n}.weight": torch.rand(16) + 0.5 for n in ("q_norm", "k_norm")}
    cfg = speculators_config(head_config(EAGLE3, model_type="qwen3", head_dim=16))
    head = load_head(write(tmp_path / "q", {**speculators_tensors(t), **norms}, cfg), target, EAGLE3)
    assert torch.equal(head.layer.self_attn.q_norm.weight, norms["layers.0.self_attn.q_norm.weight"])
    assert torch.equal(head.layer.self_attn.k_norm.weight, norms["layers.0.self_attn.k_norm.weight"])


@pytest.mark.parametrize("change, message", [
    ({"speculators_model_type": "dflash"}, "speculators 'dflash' checkpoint"),
    ({"speculators_model_type": "peagle"}, "speculators 'peagle' checkpoint"),
    ({"norm_before_fc": True}, "norm_before_fc: True"),
    ({"fc_norm": True}, "fc_norm: True"),
    ({"norm_output": True}, "norm_output: True"),
    ({"transformer_layer_config": None}, "transformer_layer_config"),
])
def test_speculators_variants_are_refused_by_name(tmp_path, target, change, message):
    cfg = speculators_config(head_config(EAGLE3))
    cfg.update(change)
    with pytest.raises(CheckpointError, match=message):
        load_head(write(tmp_path / "v", speculators_tensors(public_tensors(EAGLE3)), cfg), target, EAGLE3)


def test_speculators_config_without_norm_before_residual_is_refused(tmp_path, target):
    cfg = speculators_config(head_config(EAGLE3))
    del cfg["norm_before_residual"]  # speculators' default (false) and vLLM's (true) disagree
    with pytest.raises(CheckpointError, match="no 'norm_before_residual'"):
        load_head(write(tmp_path / "n", speculators_tensors(public_tensors(EAGLE3)), cfg), target, EAGLE3)


def test_a_norm_before_fc_is_refused_by_its_tensor(tmp_path, target):
    # Multi-layer heads and heads without fc load now: tests/drafters/test_eagle3_vllm_variants.py.
    with pytest.raises(CheckpointError, match="input_norm.weight"):
        load_head(write(tmp_path / "in", {**public_tensors(EAGLE3), "input_norm.weight": torch.ones(3 * H)},
                        head_config(EAGLE3)), target, EAGLE3)


def test_speculators_head_for_another_target_names_vocabulary_and_hidden_size(tmp_path, target):
    t = speculators_tensors(public_tensors(EAGLE3))
    cfg = speculators_config(head_config(EAGLE3))
    cfg["transformer_layer_config"]["vocab_size"] = V + 8
    with pytest.raises(CheckpointError, match=f"vocab_size {V + 8}; this target has {V}"):
        load_head(write(tmp_path / "v", t, cfg), target, EAGLE3)
    cfg = speculators_config(head_config(EAGLE3), target_hidden_size=2 * H)
    with pytest.raises(CheckpointError, match=f"hidden size {2 * H}; this target has {H}"):
        load_head(write(tmp_path / "h", t, cfg), target, EAGLE3)


# -- served: token identity and the same acceptance in both layouts ---------------------------------------

GREEDY = SamplingParams(temperature=0, max_tokens=32)
SPEC = {"controller": {"enabled": False, "profile_at_startup": False}, "num_speculative_tokens": 4}


def _as_speculators(src: Path, out: Path, target_dir: Path) -> Path:
    """hyspec's own EAGLE-3 directory rewritten in the speculators layout (same weights)."""
    embed = load_file(str(target_dir / "model.safetensors"))["model.embed_tokens.weight"]
    out.mkdir()
    save_file(speculators_tensors(load_file(str(src / "model.safetensors")), embed), str(out / "model.safetensors"))
    (out / "config.json").write_text(json.dumps(speculators_config(json.loads((src / "config.json").read_text()))))
    return out


def test_speculators_head_serves_plain_tokens_with_the_same_acceptance(tmp_path):
    target_dir = tmp_path / "target"
    make_checkpoint(target_dir, "llama_gqa", layers=2, seed=0)
    weights = load_file(str(target_dir / "model.safetensors"))
    weights["lm_head.weight"] = weights["lm_head.weight"] * 20.0  # clear greedy margins (see test_eagle_identity)
    save_file(weights, str(target_dir / "model.safetensors"), metadata={"format": "pt"})
    plain = LLM(str(target_dir), dtype="float32", kv_cache_bytes=8 << 20)
    outs = plain.generate(PROMPTS[:4], GREEDY)
    ref = [o.outputs[0].token_ids for o in outs]
    recipe, model = Eagle3Recipe(), plain.engine.model
    torch.manual_seed(0)
    head = recipe.build(model, {"ttt_steps": 2})
    batch = _batch(model, [o.prompt_token_ids + o.outputs[0].token_ids for o in outs], recipe.aux_layers(model.config))
    head.train()
    opt = torch.optim.AdamW(recipe.trainable_parameters(head), lr=1e-2)
    for _ in range(40):  # enough for accepted drafts, so equal acceptance means something
        loss, _ = recipe.loss(head, model, batch)
        opt.zero_grad()
        loss.backward()
        opt.step()
    own = tmp_path / "own"
    recipe.save(head.eval(), target_dir, own)
    spec = _as_speculators(own, tmp_path / "speculators", target_dir)
    totals = []
    for path in (own, spec):
        llm = LLM(str(target_dir), dtype="float32", kv_cache_bytes=8 << 20,
                  speculative_config={**SPEC, "method": EAGLE3, "model": str(path)})
        assert [o.outputs[0].token_ids for o in llm.generate(PROMPTS[:4], GREEDY)] == ref
        totals.append(llm.engine.spec.metrics.snapshot()["totals"])
        llm.engine.pool.assert_all_free()
    assert totals[0]["accepted_tokens"] > 0, totals[0]
    for key in ("draft_tokens", "accepted_tokens", "accepted_per_position"):
        assert totals[0][key] == totals[1][key], key
    shutil.rmtree(spec)
