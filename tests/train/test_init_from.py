"""``--init-from``: a training run that starts from a saved drafter (training continued across machines)."""
from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from hyspec.errors import HyspecError
from hyspec.model.weights import SafetensorsCheckpoint
from hyspec.train.instructions import write_prompts
from hyspec.train.trainer import train
from tests.model.tiny_checkpoint import make_checkpoint
from tests.train.conftest import small_config


def _weights(folder) -> dict[str, torch.Tensor]:
    ckpt = SafetensorsCheckpoint(folder)
    return {name: ckpt.get(name).float() for name in ckpt.names()}


@pytest.fixture
def prompts(tmp_path):
    path = tmp_path / "prompts.jsonl"
    write_prompts(path, [{"prompt": f"def f{i}(x):\n    return x + {i}\n"} for i in range(16)])
    return path


def eagle3_config(target_dir, prompts, out, **kw):
    base = dataclasses.replace(small_config(
        target_dir, prompts, out, method="eagle3", options={"draft_vocab_size": 64, "ttt_steps": 2},
        self_generate_prompts=prompts, seq_len=40, prompt_len=24, steps=6), data=[])
    return dataclasses.replace(base, **kw)


def test_eagle3_continues_from_its_saved_weights_in_place(target_dir, prompts, tmp_path):
    out = tmp_path / "e3"
    train(eagle3_config(target_dir, prompts, out))
    first = _weights(out)
    # A learning rate too small to move anything: what is saved is what was loaded.
    train(eagle3_config(target_dir, prompts, out, init_from=out, lr=1e-12, steps=2, warmup=1))
    again = _weights(out)
    assert first.keys() == again.keys()
    for name in first:
        assert torch.allclose(first[name], again[name], atol=1e-6), name
    log = json.loads((out / "training_log.json").read_text())
    assert log["init_from"]["folder"].startswith(str(out) + "@")
    assert log["init_from"]["log"]["final"]["step"] == 6  # the earlier run's log travels with the weights


def test_mtp_continues_from_its_saved_weights_stored_in_bf16(target_dir, corpus_dir, tmp_path):
    out = tmp_path / "mtp"
    train(small_config(target_dir, corpus_dir, out, method="mtp", options={"storage": "bfloat16"}, steps=4))
    first = _weights(out)
    assert SafetensorsCheckpoint(out).get(next(iter(first))).dtype == torch.bfloat16
    train(small_config(target_dir, corpus_dir, out, method="mtp", options={"storage": "bfloat16"}, steps=2,
                       warmup=1, lr=1e-12, init_from=out))
    again = _weights(out)
    assert all(torch.equal(first[k], again[k]) for k in first)


def test_a_drafter_of_another_shape_or_target_is_refused_naming_both(target_dir, prompts, tmp_path):
    out = tmp_path / "e3"
    train(eagle3_config(target_dir, prompts, out))
    with pytest.raises(HyspecError, match=r"draft vocabulary 64\).*draft vocabulary 32\)"):
        train(eagle3_config(target_dir, prompts, tmp_path / "other", init_from=out,
                            options={"draft_vocab_size": 32, "ttt_steps": 2}))
    wide = tmp_path / "wide_target"
    make_checkpoint(wide, "llama_gqa", layers=2, hidden_size=96, seed=1)
    with pytest.raises(HyspecError, match="96|64"):
        train(eagle3_config(wide, prompts, tmp_path / "wide", init_from=out))
    with pytest.raises(HyspecError, match="no drafter there"):
        train(eagle3_config(target_dir, prompts, tmp_path / "x", init_from=tmp_path / "missing"))


def test_a_resume_refuses_a_different_init_from(target_dir, prompts, tmp_path):
    a = tmp_path / "a"
    train(eagle3_config(target_dir, prompts, a))

    def stop(step, loss, metrics):
        if step == 5:  # after the checkpoint of step 4
            raise KeyboardInterrupt

    out = tmp_path / "b"
    with pytest.raises(KeyboardInterrupt):
        train(eagle3_config(target_dir, prompts, out, init_from=a), callback=stop)
    with pytest.raises(HyspecError, match="different init_from"):
        train(eagle3_config(target_dir, prompts, out, resume=True))
    train(eagle3_config(target_dir, prompts, out, resume=True, init_from=a))
