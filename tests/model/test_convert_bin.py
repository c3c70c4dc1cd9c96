"""``hyspec convert``: a pickled checkpoint becomes safetensors in an explicit step; loading never unpickles."""
from __future__ import annotations

import json
import shutil

import pytest
import torch

from hyspec.errors import CheckpointError
from hyspec.model.convert_bin import convert_bin
from hyspec.model.loader import load_model
from tests.model.hf_fixtures import make_hf_model


def _bin_checkpoint(src, dst, shards: int = 1):
    """``src``'s safetensors model rewritten as pytorch_model*.bin (with an index when sharded), tied weights
    sharing storage as torch.save keeps them."""
    from safetensors.torch import load_file

    dst.mkdir()
    state = load_file(str(src / "model.safetensors"))
    shutil.copy(src / "config.json", dst / "config.json")
    if shards == 1:
        torch.save(state, dst / "pytorch_model.bin")
        return dst
    names = sorted(state)
    weight_map = {}
    for s in range(shards):
        part = {n: state[n] for n in names[s::shards]}
        file = f"pytorch_model-{s + 1:05d}-of-{shards:05d}.bin"
        torch.save(part, dst / file)
        weight_map.update({n: file for n in part})
    (dst / "pytorch_model.bin.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return dst


@pytest.mark.parametrize("shards", [1, 2])
def test_converted_checkpoint_is_the_same_model(tmp_path, shards):
    make_hf_model("qwen2", tmp_path / "st")  # tied embeddings
    src = _bin_checkpoint(tmp_path / "st", tmp_path / "bin", shards)
    with pytest.raises(CheckpointError, match="hyspec convert"):
        load_model(src, dtype="float32")  # the loader never unpickles, and says what to do
    report = convert_bin(src, tmp_path / "out")
    from safetensors.torch import load_file

    assert report.tensors == len(load_file(str(tmp_path / "st" / "model.safetensors")))
    assert len(report.sources) == shards
    assert "config.json" in report.copied and (tmp_path / "out" / "model.safetensors").is_file()
    ids = torch.tensor([[5, 17, 33, 9, 60, 2]])
    a, b = load_model(tmp_path / "st", dtype="float32"), load_model(tmp_path / "out", dtype="float32")
    torch.testing.assert_close(b.compute_logits(b.forward_dense(ids).hidden),
                               a.compute_logits(a.forward_dense(ids).hidden), rtol=0, atol=0)


class _RunsCode:
    def __reduce__(self):
        import os

        return (os.mkdir, (str(_RunsCode.marker),))


def test_a_pickle_with_code_is_refused_and_never_run(tmp_path):
    _RunsCode.marker = tmp_path / "code-ran"
    (tmp_path / "src").mkdir()
    torch.save({"w": torch.zeros(2), "payload": _RunsCode()}, tmp_path / "src" / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match="weights_only=True refused it"):
        convert_bin(tmp_path / "src", tmp_path / "out")
    assert not _RunsCode.marker.exists() and not (tmp_path / "out").exists()


def test_cli_says_what_it_read_and_never_overwrites(tmp_path, capsys):
    from hyspec.cli.main import main

    make_hf_model("llama_gqa", tmp_path / "st")
    src = _bin_checkpoint(tmp_path / "st", tmp_path / "bin")
    assert main(["convert", str(src), str(tmp_path / "out")]) == 0
    said = capsys.readouterr().out
    assert "pytorch_model.bin with torch.load(weights_only=True)" in said and "float32" in said
    assert main(["convert", str(src), str(tmp_path / "out")]) == 2
    assert "not an empty directory" in capsys.readouterr().err


def test_an_eagle1_head_published_as_bin_loads_after_conversion(tmp_path):
    """SafeAILab's EAGLE-1/2 heads ship as pytorch_model.bin: converted, the head loads as the same head."""
    from safetensors.torch import load_file

    from hyspec.drafters.eagle.checkpoint import load_head
    from hyspec.drafters.eagle.model import EAGLE
    from hyspec.drafters.eagle.recipe import EagleRecipe
    from tests.drafters.test_eagle_checkpoint import tiny_target

    target = tiny_target()
    recipe = EagleRecipe()
    built = recipe.build(target, {}).eval()
    recipe.save(built, tmp_path, tmp_path / "st")
    published = tmp_path / "published"
    published.mkdir()
    shutil.copy(tmp_path / "st" / "config.json", published / "config.json")
    torch.save(load_file(str(tmp_path / "st" / "model.safetensors")), published / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match="hyspec convert"):
        load_head(published, target, EAGLE)
    convert_bin(published, tmp_path / "converted")
    loaded = load_head(tmp_path / "converted", target, EAGLE)
    ids, feats = torch.randint(0, 64, (1, 9)), torch.randn(1, 9, built.config.feature_size)
    with torch.no_grad():
        assert torch.equal(built.forward_dense(ids, built.fuse(feats)), loaded.forward_dense(ids, loaded.fuse(feats)))
