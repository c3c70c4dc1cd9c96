"""The NPU backend end to end on an emulated stack: block sizes, the probe's op plan, the first-contact dry run.

HYSPEC_NPU_EMULATE=<op-plugin branch> stands hyspec's pure-torch torch_npu of that release in for the
real one; the NPU backend then computes on the host.  What this shows is the plumbing and the choices
(docs/npu.md, "What has and has not been executed"), not the kernels.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hyspec import LLM, SamplingParams
from hyspec.errors import ConfigError
from hyspec.npu_ops.emulation import fake_torch_npu

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def emulated_npu(monkeypatch):
    from hyspec.backends.probe import clear_cache

    monkeypatch.setenv("HYSPEC_NPU_EMULATE", "26.1.0")
    monkeypatch.setitem(sys.modules, "torch_npu", fake_torch_npu(version="26.1.0"))
    clear_cache()
    yield
    clear_cache()


def test_the_npu_backend_defaults_to_128_token_blocks_and_speculates_losslessly(tiny_ckpt, emulated_npu):
    path = str(tiny_ckpt[0])
    params = SamplingParams(temperature=0, max_tokens=20)
    prompts = ["def add(a, b):", "x = [1, 2, 3, 1, 2, 3, 1, 2"]
    with LLM(path, backend="npu", dtype="bfloat16") as plain:
        engine = plain.engine
        assert engine.backend.name == "npu" and engine.backend.emulated == "26.1.0"
        assert engine.block_size == 128 and engine.layout.block_size == 128
        # a one-layer drafter letting the pool choose gets FIA's largest block, not all of a page
        drafter = engine.pool.register("probe-drafter", 1, engine.config.num_key_value_heads,
                                       engine.config.head_dim, engine.dtype)
        assert drafter.block_size % 128 == 0 and drafter.block_size <= 512
        expected = [o.outputs[0].token_ids for o in plain.generate(prompts, params)]
    with LLM(path, backend="npu", dtype="bfloat16", block_size=256,
             speculative_config={"method": "ngram", "num_speculative_tokens": 4}) as spec:
        assert spec.engine.layout.block_size == 256
        assert [o.outputs[0].token_ids for o in spec.generate(prompts, params)] == expected


@pytest.mark.parametrize("bad", [0, -16, True, 16.0, 5000])
def test_a_bad_block_size_is_named(tiny_ckpt, bad):
    with pytest.raises(ConfigError, match="block_size"):
        LLM(str(tiny_ckpt[0]), dtype="float32", kv_cache_bytes=1 << 20, block_size=bad)


def test_serve_and_generate_take_block_size():
    import argparse

    from hyspec.cli import serve
    from hyspec.cli.model_args import add_engine_arguments, model_kwargs

    parser = argparse.ArgumentParser()
    serve.add_arguments(parser)
    assert serve.engine_args(parser.parse_args(["--model", "m", "--block-size", "128"]))["block_size"] == 128
    assert serve.engine_args(parser.parse_args(["--model", "m"]))["block_size"] is None  # the backend's default
    parser = argparse.ArgumentParser()
    add_engine_arguments(parser)
    assert model_kwargs(parser.parse_args(["--block-size", "256"]))["block_size"] == 256


def _probe(spec: str) -> dict:
    env = dict(os.environ, HYSPEC_NPU_EMULATE=spec)
    r = subprocess.run([sys.executable, "-m", "hyspec.cli.main", "probe", "--json"], capture_output=True,
                       text=True, timeout=300, env=env, cwd=REPO)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout)["backends"]["npu"]


def test_probe_json_names_each_ops_variant_and_why_on_both_releases():
    pinned, older, no_atb = _probe("26.1.0"), _probe("7.1.0"), _probe("26.1.0:no-atb")
    assert pinned["available"] and pinned["emulated"] == "26.1.0" and "EMULATED" in pinned["hint"]
    ops = pinned["op_plan"]["ops"]
    assert ops["rotary"]["uses"][0].startswith("torch_npu.npu_apply_rotary_pos_emb")
    assert ops["write_kv"]["uses"][0].startswith("torch_npu.npu_scatter_pa_kv_cache (cache_mode='Norm')")
    assert pinned["op_plan"]["atb"]["loaded"] is True
    old = older["op_plan"]["ops"]
    assert old["rotary"]["uses"][0].startswith("torch_npu.npu_rotary_mul")
    assert "takes no rotary_mode" in old["rotary"]["rejected"]["torch_npu.npu_apply_rotary_pos_emb"]
    assert old["write_kv"]["rejected"]["torch_npu.npu_scatter_pa_kv_cache"] == "torch_npu has no npu_scatter_pa_kv_cache"
    assert "TND with PageAttention is not documented" in old["attention"]["uses"][0]
    assert older["op_plan"]["op_plugin"].startswith("op-plugin 7.1.0 @ 57c52665a1")
    assert no_atb["op_plan"]["atb"]["loaded"] is False
    assert "nnal/atb/set_env.sh" in no_atb["op_plan"]["atb"]["detail"]
    assert "ATB not loaded" in no_atb["op_plan"]["ops"]["write_kv"]["rejected"]["torch_npu._npu_reshape_and_cache"]


def test_first_contact_dry_run_on_the_older_release_passes_and_keeps_every_step(tmp_path):
    """scripts/npu_first_contact.sh --dry-run 7.1.0: the fallbacks carry every step; the report holds them all."""
    out = tmp_path / "report.json"
    r = subprocess.run(["bash", "scripts/npu_first_contact.sh", "--dry-run", "7.1.0", "--skip-default-model",
                        "--out", str(out)], capture_output=True, text=True, timeout=900, cwd=REPO,
                       env=dict(os.environ, PYTHON=sys.executable))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    report = json.loads(out.read_text())
    steps = {s["step"]: s for s in report["steps"]}
    assert report["dry_run"] == "7.1.0" and report["summary"]["steps_failed"] == 0
    assert "skipped" in steps["npu-smi info"]  # no driver here
    assert steps["versions"]["result"]["torch_npu"] == "2.5.1.post1"
    assert steps["op plan (signatures, ATB, variants)"]["result"]["signatures"]["apply_rotary_pos_emb"].endswith(
        "str layout=\"BSH\") -> (Tensor, Tensor)")
    ladder = steps["attention ladder"]["result"]
    assert ladder and all(rung["passed"] for rung in ladder)
    assert {rung["route"] for rung in ladder} == {"paged_attention", "BSND"}  # 7.1.0: no TND PageAttention
    assert steps["conformance (tiny target)"]["result"]["passed"] is True
