"""MTP modules in MiMo's layout (``model.mtp_layers.{i}.*`` inside the target checkpoint, as vLLM 0.32's
``mimo_mtp.py`` reads them): the same modules as DeepSeek's layout, ``input_proj`` over ``cat[hidden, embedding]``
swapped into ``eh_proj``'s ``cat[embedding, hidden]``.  Both layouts load to the same weights, and served,
return plain decoding's tokens with the same acceptance.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from hyspec.drafters.mtp.checkpoint import load_mtp, save_deepseek_layout
from hyspec.errors import CheckpointError
from hyspec.model.loader import load_model
from tests.drafters.hidden_drafters import (  # noqa: F401  (fixtures)
    GREEDY, PROMPTS, plain, spec_llm, target_dir, train_drafter)


def as_mimo(deepseek_dir: Path, out: Path) -> Path:
    """A DeepSeek-layout directory rewritten with MiMo's MTP tensor names (same weights)."""
    shutil.copytree(deepseek_dir, out)
    n = json.loads((deepseek_dir / "config.json").read_text())["num_hidden_layers"]
    index = json.loads((out / "model.safetensors.index.json").read_text())
    mtp = load_file(str(out / "model-mtp.safetensors"))
    renamed = {}
    for name, t in mtp.items():
        layer, rest = name[len("model.layers."):].split(".", 1)
        src = f"model.mtp_layers.{int(layer) - n}."
        if rest in ("shared_head.head.weight", "embed_tokens.weight"):
            continue  # DeepSeek's copies of the shared weights; MiMo shares the model's
        if rest == "eh_proj.weight":
            h = t.shape[0]
            renamed[src + "input_proj.weight"] = torch.cat([t[:, h:], t[:, :h]], dim=1).contiguous()
        else:
            renamed[src + {"enorm.weight": "token_layernorm.weight", "hnorm.weight": "hidden_layernorm.weight",
                           "shared_head.norm.weight": "final_layernorm.weight"}.get(rest, rest)] = t
    save_file(renamed, str(out / "model-mtp.safetensors"), metadata={"format": "pt"})
    weight_map = {k: v for k, v in index["weight_map"].items() if v != "model-mtp.safetensors"}
    weight_map.update({k: "model-mtp.safetensors" for k in renamed})
    (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return out


@pytest.fixture(scope="module")
def layouts(target_dir, plain, tmp_path_factory):
    """(target, DeepSeek-layout dir, MiMo-layout dir) of one briefly trained pair of MTP modules."""
    root = tmp_path_factory.mktemp("mimo_mtp")
    train_drafter("mtp", target_dir, root / "own", plain["sequences"], steps=40, options={"num_modules": 2})
    target = load_model(target_dir, dtype="float32")
    own = load_mtp(root / "own", target.config, target.embed_tokens.weight, target.lm_head_weight, torch.float32)
    save_deepseek_layout(own, target_dir, root / "deepseek")
    return target, root / "deepseek", as_mimo(root / "deepseek", root / "mimo")


def test_mimo_layout_loads_the_same_modules(layouts):
    target, deepseek, mimo = layouts
    a, b = (load_mtp(p, target.config, target.embed_tokens.weight, target.lm_head_weight, torch.float32).state_dict()
            for p in (deepseek, mimo))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_mimo_layout_serves_plain_tokens_with_the_same_acceptance(layouts, plain):
    _, deepseek, mimo = layouts
    totals = []
    for path in (deepseek, mimo):
        llm = spec_llm(path, {"method": "mtp", "num_speculative_tokens": 2})
        assert [o.outputs[0].token_ids for o in llm.generate(PROMPTS[:4], GREEDY)] == plain["outputs"][:4]
        totals.append(llm.engine.spec.metrics.snapshot()["totals"])
    assert totals[0]["accepted_tokens"] > 0, totals[0]
    for key in ("draft_tokens", "accepted_tokens", "accepted_per_position"):
        assert totals[0][key] == totals[1][key], key


def test_mimo_layout_missing_a_tensor_is_refused_by_name(layouts, tmp_path):
    target, _, mimo = layouts
    bad = tmp_path / "bad"
    shutil.copytree(mimo, bad)
    tensors = load_file(str(bad / "model-mtp.safetensors"))
    del tensors["model.mtp_layers.1.final_layernorm.weight"]
    save_file(tensors, str(bad / "model-mtp.safetensors"))
    index = json.loads((bad / "model.safetensors.index.json").read_text())
    del index["weight_map"]["model.mtp_layers.1.final_layernorm.weight"]
    (bad / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match="lacks tensor 'model.mtp_layers.1.final_layernorm.weight'"):
        load_mtp(bad, target.config, target.embed_tokens.weight, target.lm_head_weight, torch.float32)


def _rms(x, w, eps):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def test_mimo_input_projection_is_mimos(layouts):
    """MiMo's module input, written from its MiMoMTPLayers.forward over the stored tensors:
    input_proj(cat[hidden_layernorm(h), token_layernorm(embedding)]) -- what the loaded module computes."""
    target, _, mimo = layouts
    drafter = load_mtp(mimo, target.config, target.embed_tokens.weight, target.lm_head_weight, torch.float32)
    t = load_file(str(mimo / "model-mtp.safetensors"))
    eps = target.config.rms_norm_eps
    g = torch.Generator().manual_seed(4)
    ids, hidden = torch.randint(1, target.config.vocab_size, (6,), generator=g), torch.randn(6, 64, generator=g)
    for m in range(2):
        p = f"model.mtp_layers.{m}."
        ref = torch.cat([_rms(hidden, t[p + "hidden_layernorm.weight"], eps),
                         _rms(target.embed_tokens.weight[ids], t[p + "token_layernorm.weight"], eps)], -1) \
            @ t[p + "input_proj.weight"].T
        with torch.no_grad():
            mine = drafter._combine(m, ids, hidden, torch.zeros(6, dtype=torch.bool))
        torch.testing.assert_close(mine, ref, rtol=1e-5, atol=1e-5)
