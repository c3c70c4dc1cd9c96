"""draft_model's size options: embeddings started from the target's principal directions, bf16 storage."""
from __future__ import annotations

import json

import pytest
import torch

from hyspec.drafters.draft_model.recipe import DraftModelRecipe
from hyspec.errors import ConfigError
from hyspec.model.loader import load_model
from hyspec.model.weights import SafetensorsCheckpoint
from hyspec.train.trainer import train
from tests.train.conftest import small_config


def test_target_pca_embeddings_span_the_targets_top_directions(target_dir):
    target = load_model(target_dir, dtype="float32")
    model = DraftModelRecipe().build(target, {"hidden_size": 16, "layers": 1, "embedding_init": "target_pca"})
    e = target.embed_tokens.weight.float()
    _, s, vt = torch.linalg.svd(e - e.mean(0), full_matrices=False)
    # The drafter's embedding is the target's seen through its 16 widest directions: same Gram matrix as that view.
    view = e @ vt[:16].T
    assert torch.allclose(model.embed_tokens.weight @ model.embed_tokens.weight.T, view @ view.T, atol=1e-3)
    with pytest.raises(ConfigError, match="target_pca needs hidden_size"):
        DraftModelRecipe().build(target, {"hidden_size": 4 * target.config.hidden_size,
                                          "embedding_init": "target_pca"})
    with pytest.raises(ConfigError, match="embedding_init"):
        DraftModelRecipe().build(target, {"embedding_init": "copy"})


def test_bf16_storage_halves_the_file_and_says_so_in_config(target_dir, corpus_dir, tmp_path):
    out = tmp_path / "dm"
    train(small_config(target_dir, corpus_dir, out, steps=2,
                       options={"hidden_size": 32, "layers": 1, "storage": "bfloat16",
                                "embedding_init": "target_pca"}))
    assert json.loads((out / "config.json").read_text())["torch_dtype"] == "bfloat16"
    ckpt = SafetensorsCheckpoint(out)
    assert {ckpt.get(n).dtype for n in ckpt.names()} == {torch.bfloat16}
    with pytest.raises(ConfigError, match="storage"):
        DraftModelRecipe().build(load_model(target_dir, dtype="float32"), {"storage": "int4"})



@pytest.mark.parametrize("method,storage", [("dflash", "bfloat16"), ("dspark", "int8"), ("mtp", "int8")])
def test_head_drafters_store_compactly_and_serve_the_same_tokens(target_dir, corpus_dir, tmp_path, monkeypatch,
                                                                  method, storage):
    from hyspec import LLM, SamplingParams
    from hyspec.drafters import checkpoint_io

    monkeypatch.setattr(checkpoint_io, "INT8_MIN_NUMEL", 1024)  # the tiny target's matrices are int8-stored too
    out = tmp_path / method
    train(small_config(target_dir, corpus_dir, out, method=method, steps=2,
                       options={"layers": 1, "storage": storage}))
    ckpt = SafetensorsCheckpoint(out)
    dtypes = {n: ckpt.get(n).dtype for n in ckpt.names()}
    if storage == "int8":  # matrices int8 with an fp32 scale per row, the small rest bf16
        assert torch.int8 in dtypes.values()
        assert all(dtypes[n] == torch.float32 for n in dtypes if n.endswith("_scale"))
    else:
        assert {d for d in dtypes.values() if d.is_floating_point} == {torch.bfloat16}
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    plain = LLM(str(target_dir), dtype="float32").generate(["def f(x):"], params)[0].outputs[0].token_ids
    spec = LLM(str(target_dir), dtype="float32", speculative_config={"method": method, "model": str(out)})
    assert spec.generate(["def f(x):"], params)[0].outputs[0].token_ids == plain
    with pytest.raises(ConfigError, match="storage"):
        train(small_config(target_dir, corpus_dir, tmp_path / "bad", method=method, steps=1,
                           options={"layers": 1, "storage": "int4"}))
