"""`hyspec draft-worker` and `hyspec generate` with draft_placement "remote"."""
from __future__ import annotations

import json
import shlex
import subprocess
import sys

import pytest

from hyspec.cli.draft_worker import ray_start_command
from hyspec.cli.main import main
from hyspec.errors import ConfigError
from tests.remote.conftest import inprocess_handles, remote_placement, spec_config


def test_dry_run_prints_the_ray_start_command(capsys, monkeypatch):
    monkeypatch.setenv("RAY_AUTH_TOKEN", "the-clusters-token")
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    assert main(["draft-worker", "--address", "10.1.2.3:6379", "--num-cpus", "16", "--node-ip-address", "10.1.2.9",
                 "--resources", '{"avx512": 1}', "--dry-run"]) == 0
    out = capsys.readouterr().out
    cmd = shlex.split(out)
    assert cmd[0] == "RAY_AUTH_MODE=token" and "the-clusters-token" not in out  # token auth, token not shown
    assert cmd[2:5] == ["start", "--address=10.1.2.3:6379", "--node-ip-address=10.1.2.9"]
    assert json.loads(cmd[5].removeprefix("--resources=")) == {"hyspec_draft": 1, "avx512": 1}
    assert cmd[6:] == ["--num-cpus=16", "--block"]


@pytest.mark.parametrize("kw,key", [
    ({"address": "ray://head:10001"}, "--address"),  # a node joins the cluster, not a Ray Client session
    ({"resources": "{not json"}, "--resources"),
    ({"resources": '{"hyspec_draft": 4}'}, "--resources"),
    ({"resources": '{"gpu_like": -1}'}, "--resources"),
    ({"num_cpus": 0}, "--num-cpus"),
])
def test_bad_flags_name_the_flag(kw, key):
    args = {"address": "head:6379", "num_cpus": None, "resources": None, "block": True, **kw}
    with pytest.raises(ConfigError) as e:
        ray_start_command(**args)
    assert e.value.key == key


def test_cli_module_imports_neither_torch_nor_ray():
    code = "import sys, hyspec.cli.draft_worker; print('torch' in sys.modules or 'ray' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "False"


def test_generate_picks_up_remote_placement(target_dir, draft_dir, capsys):
    config = json.dumps(spec_config(model=draft_dir, remote={"draft_deadline_ms": 5000}))
    with remote_placement(inprocess_handles()):
        rc = main(["generate", "--model", str(target_dir), "--prompt", "def f(x):", "--max-tokens", "12",
                   "--dtype", "float32", "--kv-cache-bytes", str(8 << 20), "--speculative-config", config])
    assert rc == 0
    assert "draft tokens accepted" in capsys.readouterr().err  # it speculated, through the remote proposer
