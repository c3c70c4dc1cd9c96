"""The one drafter-directory reader/writer every drafter checkpoint module uses."""
from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from hyspec.drafters.checkpoint_io import read_config_json, save_checkpoint
from hyspec.errors import CheckpointError


def test_read_config_json_names_the_file_and_the_fault(tmp_path):
    with pytest.raises(CheckpointError, match="MTP drafter directory .* does not exist"):
        read_config_json(tmp_path / "absent", "MTP drafter")
    with pytest.raises(CheckpointError, match="config.json not found: the EAGLE head directory needs config.json"):
        read_config_json(tmp_path, "EAGLE head")
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="config.json is not valid JSON"):
        read_config_json(tmp_path, "dflash drafter")
    (tmp_path / "config.json").write_bytes(b"\xff\xfe{}")
    with pytest.raises(CheckpointError, match="not valid JSON"):
        read_config_json(tmp_path, "dflash drafter")
    (tmp_path / "config.json").write_text("[1, 2]")
    with pytest.raises(CheckpointError, match="must hold a JSON object"):
        read_config_json(tmp_path, "dflash drafter")
    (tmp_path / "config.json").write_text('{"a": 1}')
    assert read_config_json(tmp_path, "dflash drafter") == {"a": 1}


def test_save_checkpoint_writes_cpu_tensors_then_the_config(tmp_path):
    tensors = {"w": torch.arange(6.0).view(2, 3).t(), "b": torch.ones(2, requires_grad=True)}  # non-contiguous, grad
    out = save_checkpoint(tmp_path / "d", tensors, {"z": 1, "a": {"k": [1, 2]}})
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]  # no .tmp left behind
    loaded = load_file(str(out / "model.safetensors"))
    assert torch.equal(loaded["w"], tensors["w"]) and torch.equal(loaded["b"], torch.ones(2))
    assert json.loads((out / "config.json").read_text()) == {"z": 1, "a": {"k": [1, 2]}}
    assert read_config_json(out, "test drafter") == {"z": 1, "a": {"k": [1, 2]}}


def test_every_drafter_checkpoint_module_reads_through_it(tmp_path, monkeypatch):
    import hyspec.drafters.checkpoint_io as io
    from hyspec.drafters.dflash.checkpoint import read_drafter_config
    from hyspec.drafters.eagle.checkpoint import read_config
    from hyspec.drafters.mtp.checkpoint import mtp_layout

    seen = []
    real = io.read_config_json
    for module in ("hyspec.drafters.dflash.checkpoint", "hyspec.drafters.eagle.checkpoint",
                   "hyspec.drafters.mtp.checkpoint"):
        monkeypatch.setattr(f"{module}.read_config_json", lambda p, kind: seen.append(kind) or real(p, kind))
    for read in (lambda p: read_drafter_config(p, "dflash"), read_config, mtp_layout):
        with pytest.raises(CheckpointError, match="does not exist"):
            read(tmp_path / "absent")
    assert seen == ["dflash drafter", "EAGLE head", "MTP drafter"]
