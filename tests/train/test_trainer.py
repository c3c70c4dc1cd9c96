"""The generic trainer: aux-layer features, hidden cache, loss going down, exact resume, atomic output."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn

from hyspec.model.llama import CausalLM
from hyspec.train.base import RECIPES, DrafterRecipe, TargetBatch
from hyspec.train.trainer import train
from hyspec.train.workspace import is_complete
from tests.train.conftest import small_config


class AuxProbeRecipe(DrafterRecipe):
    """A linear head over [first layer ; last layer ; final hidden] that predicts through the target's lm_head.

    It records every batch it is given, so the test can check the features against the target itself.
    """

    method = "aux_probe"

    def __init__(self):
        self.seen: list[TargetBatch] = []

    def aux_layers(self, target_cfg):
        return (0, target_cfg.num_hidden_layers - 1)

    def build(self, target: CausalLM, options):
        H = target.config.hidden_size
        return nn.Linear(3 * H, H)

    def loss(self, drafter, target, batch):
        self.seen.append(batch)
        last = target.config.num_hidden_layers - 1
        feats = torch.cat([batch.aux[0], batch.aux[last], batch.hidden], dim=-1)[batch.loss_mask]  # [N, 3H]
        log_q = F.log_softmax(target.compute_logits(drafter(feats)), -1)  # lm_head frozen, shared
        log_p = F.log_softmax(batch.target_logits(target)[batch.loss_mask], -1)
        loss = F.kl_div(log_q, log_p, log_target=True, reduction="batchmean")
        return loss, {"acc_0": (log_q.argmax(-1) == log_p.argmax(-1)).float().mean().item()}

    def save(self, drafter, target_dir: Path, out_dir: Path) -> None:
        (out_dir / "config.json").write_text(json.dumps({"method": self.method}))
        save_file({k: v.contiguous() for k, v in drafter.state_dict().items()}, str(out_dir / "model.safetensors"))


@pytest.fixture
def probe(monkeypatch):
    recipe = AuxProbeRecipe()
    monkeypatch.setitem(RECIPES, recipe.method, recipe)
    return recipe


def weights(out: Path) -> dict[str, torch.Tensor]:
    return load_file(str(out / "model.safetensors"))


def test_generic_path_feeds_aux_layers_of_the_target(target_dir, corpus_dir, tmp_path, probe):
    from hyspec.model.loader import load_model

    result = train(small_config(target_dir, corpus_dir, tmp_path / "out", method="aux_probe", steps=3, options={}))
    assert is_complete(tmp_path / "out") and result.steps == 3 and "acc_0" in result.metrics
    target = load_model(target_dir)
    for batch in probe.seen:
        ref = target.forward_dense(batch.input_ids, aux_layers=(0, 1))
        assert set(batch.aux) == {0, 1} and batch.hidden.shape == (4, 32, target.config.hidden_size)
        assert torch.equal(batch.hidden, ref.hidden)
        assert all(torch.equal(batch.aux[k], ref.aux_hidden[k]) for k in (0, 1))
    assert not (tmp_path / "out.partial").exists()  # the working folder goes once the output is in place


def test_hidden_cache_trains_like_on_the_fly(target_dir, corpus_dir, tmp_path, probe):
    # few windows, many steps: later epochs read the cache
    kw = dict(method="aux_probe", steps=8, options={}, max_tokens=150, log_every=4)
    train(small_config(target_dir, corpus_dir, tmp_path / "live", **kw))
    cached = train(small_config(target_dir, corpus_dir, tmp_path / "cached", cache_hidden=True, keep_work=True, **kw))
    assert cached.history[-1]["epoch"] > 2
    meta = json.loads((tmp_path / "cached.partial" / "hidden" / "meta.json").read_text())
    assert meta["shape"][0] * 8 < 4 * 8 * 8  # fewer windows than the batches drew
    a, b = weights(tmp_path / "live"), weights(tmp_path / "cached")
    assert all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)


def test_loss_decreases(target_dir, corpus_dir, tmp_path):
    result = train(small_config(target_dir, corpus_dir, tmp_path / "out", steps=40, log_every=5,
                                options={"hidden_size": 64, "layers": 1}, work_dir=tmp_path / "work"))
    assert not (tmp_path / "work").exists()
    losses = [e["loss"] for e in result.history]
    assert len(losses) == 8 and sum(losses[-2:]) < 0.7 * sum(losses[:2])
    log = json.loads((tmp_path / "out" / "training_log.json").read_text())
    assert log["final"]["step"] == 40 and log["data"]["tokens"] > 0 and log["time"]["seconds_per_step"] > 0
    assert log["args"]["method"] == "draft_model" and log["log"] == result.history


class Interrupt(Exception):
    pass


def stop_at(step_to_stop: int, exc: type[BaseException] = Interrupt):
    def callback(step, loss, metrics):
        if step == step_to_stop:
            raise exc

    return callback


@pytest.mark.parametrize("cache_hidden", [False, True])
def test_resume_gives_the_same_weights_as_an_uninterrupted_run(target_dir, corpus_dir, tmp_path, capsys, cache_hidden):
    kw = dict(cache_hidden=cache_hidden, max_tokens=300)  # 10 windows: batches of later epochs hit the cache
    full = train(small_config(target_dir, corpus_dir, tmp_path / "full", **kw))
    out = tmp_path / "resumed"
    with pytest.raises(KeyboardInterrupt):  # Ctrl-C after step 6
        train(small_config(target_dir, corpus_dir, out, **kw), callback=stop_at(6, KeyboardInterrupt))
    assert "--resume" in capsys.readouterr().err
    assert not out.exists()  # nothing that looks like an output
    ckpt = torch.load(out.with_name("resumed.partial") / "checkpoint.pt", weights_only=True)
    assert ckpt["step"] == 4
    with pytest.raises(Exception, match="--resume"):  # an earlier run's checkpoint is never silently dropped
        train(small_config(target_dir, corpus_dir, out, **kw))
    resumed = train(small_config(target_dir, corpus_dir, out, resume=True, **kw))
    a, b = weights(tmp_path / "full"), weights(out)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    strip = lambda h: [{k: v for k, v in e.items() if k != "train_s"} for e in h]  # noqa: E731
    assert strip(resumed.history) == strip(full.history)
    assert json.loads((out / "training_log.json").read_text())["resumed_from_step"] == 4


def test_resume_refuses_changed_settings(target_dir, corpus_dir, tmp_path):
    out = tmp_path / "out"
    with pytest.raises(Interrupt):
        train(small_config(target_dir, corpus_dir, out), callback=stop_at(5))
    with pytest.raises(Exception, match="different lr"):
        train(small_config(target_dir, corpus_dir, out, resume=True, lr=1e-2))


def test_failure_while_saving_leaves_no_complete_output(target_dir, corpus_dir, tmp_path, monkeypatch):
    from hyspec.drafters.draft_model.recipe import DraftModelRecipe

    real_save = DraftModelRecipe.save

    def broken_save(self, drafter, target, out_dir):
        real_save(self, drafter, target, out_dir)
        raise OSError("disk full")

    monkeypatch.setattr(DraftModelRecipe, "save", broken_save)
    out = tmp_path / "out"
    with pytest.raises(OSError, match="disk full"):
        train(small_config(target_dir, corpus_dir, out, steps=2))
    assert not out.exists()
    monkeypatch.undo()
    train(small_config(target_dir, corpus_dir, out, steps=2, resume=True))  # picks up the final checkpoint
    assert is_complete(out)


def test_self_generated_data_is_cached_shared_and_completed_after_interruption(target_dir, corpus_dir, tmp_path,
                                                                                 monkeypatch):
    from hyspec.train import selfgen

    kw = dict(steps=3, seq_len=24, self_generate=6, prompt_len=8, self_generate_temperature=0.8)
    whole = train(small_config(target_dir, corpus_dir, tmp_path / "whole", **kw))
    assert whole.history[-1]["step"] == 3
    log = json.loads((tmp_path / "whole" / "training_log.json").read_text())
    assert log["data"]["self_generated"] == 6 and log["data"]["windows"] == 6

    shared = tmp_path / "shared.pt"
    monkeypatch.setattr(selfgen, "CHUNK", 4)  # two chunks; sampled, so per-prompt seeds must survive chunking
    train(small_config(target_dir, corpus_dir, tmp_path / "a", self_generate_cache=shared, **kw))
    saved = torch.load(shared, weights_only=True)
    assert [len(c) for c in saved["ids"]] == [4, 2]
    saved["ids"], saved["loss_mask"] = saved["ids"][:1], saved["loss_mask"][:1]  # as if stopped after chunk 1
    torch.save(saved, shared)
    train(small_config(target_dir, corpus_dir, tmp_path / "b", self_generate_cache=shared, **kw))

    def no_generation(*args, **kwargs):
        raise AssertionError("the shared cache should have been used")

    monkeypatch.setattr(selfgen, "make_generator", no_generation)
    train(small_config(target_dir, corpus_dir, tmp_path / "c", self_generate_cache=shared, **kw))
    ref = weights(tmp_path / "whole")
    for name in ("a", "b", "c"):
        got = weights(tmp_path / name)
        assert all(torch.equal(ref[k], got[k]) for k in ref), name
