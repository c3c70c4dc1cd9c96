"""Which ops the installed torch_npu backs: detection at call time, per-op fallback, the report, lazy imports."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from hyspec.backends.optable import resolve_ops
from hyspec.npu_ops import NPU_OPS, npu_op_overrides, npu_op_report
from hyspec.npu_ops.emulation import fake_torch_npu
from hyspec.ops import OP_NAMES, REFERENCE


def install(monkeypatch, **kwargs):
    module = fake_torch_npu(**kwargs)
    monkeypatch.setitem(sys.modules, "torch_npu", module)
    return module


def test_importing_npu_ops_needs_no_torch_npu() -> None:
    code = ("import sys, json; import hyspec.npu_ops, hyspec.npu_ops.attention, hyspec.npu_ops.kv, "
            "hyspec.npu_ops.norm, hyspec.npu_ops.rotary, hyspec.npu_ops.graph, hyspec.npu_ops.emulation; "
            "from hyspec.npu_ops import npu_op_report; "
            "print(json.dumps({'loaded': 'torch_npu' in sys.modules, 'report': npu_op_report()}))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["loaded"] is False
    assert set(out["report"]) == set(OP_NAMES)
    assert all(out["report"][op].startswith("reference: torch_npu cannot be imported") for op in NPU_OPS)


def test_without_torch_npu_the_overrides_raise_import_error_and_the_backend_keeps_references(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "torch_npu", None)  # `import torch_npu` raises ImportError
    with pytest.raises(ImportError):
        npu_op_overrides()
    resolved = resolve_ops("hyspec.npu_ops", "npu_op_overrides", source="torch_npu")
    assert resolved.table.native_ops() == [] and "import of torch_npu halted" in resolved.note


def test_a_full_torch_npu_backs_four_ops(monkeypatch) -> None:
    install(monkeypatch)
    assert sorted(npu_op_overrides()) == sorted(NPU_OPS)
    table = resolve_ops("hyspec.npu_ops", "npu_op_overrides", source="torch_npu").table
    assert {op: table.sources[op] for op in OP_NAMES} == {
        op: ("torch_npu" if op in NPU_OPS else REFERENCE) for op in OP_NAMES}
    report = npu_op_report()
    assert report["attention"].startswith("torch_npu.npu_fused_infer_attention_score")
    assert "torch_npu._npu_paged_attention (single-token decode)" in report["attention"]
    assert report["write_kv"] == "torch_npu.npu_scatter_pa_kv_cache (cache_mode='Norm')"
    assert report["compact_kv"].startswith("reference: hyspec uses no torch_npu op")


def test_an_older_torch_npu_falls_back_per_op_and_says_which(monkeypatch) -> None:
    install(monkeypatch, missing=["npu_fused_infer_attention_score", "npu_scatter_pa_kv_cache",
                                  "npu_apply_rotary_pos_emb", "_npu_rotary_embedding", "npu_add_rms_norm"])
    ops = npu_op_overrides()
    assert sorted(ops) == ["rms_norm", "write_kv"]
    report = npu_op_report()
    assert report["attention"] == ("reference: torch_npu has no torch_npu.npu_fused_infer_attention_score / "
                                   "torch.ops.npu.npu_fused_infer_attention_score")
    assert report["rotary"].startswith("reference: torch_npu has no torch_npu.npu_apply_rotary_pos_emb")
    assert report["write_kv"].startswith("torch_npu._npu_reshape_and_cache")
    assert "with residual: torch add + npu_rms_norm" in report["rms_norm"]
    table = resolve_ops("hyspec.npu_ops", "npu_op_overrides", source="torch_npu").table
    assert table.sources["attention"] == REFERENCE and table.sources["write_kv"] == "torch_npu"


def test_decode_without_paged_attention_is_reported(monkeypatch) -> None:
    install(monkeypatch, missing=["_npu_paged_attention"])
    assert "attention" in npu_op_overrides()
    assert "single-token decode also on FIA" in npu_op_report()["attention"]


def test_a_torch_npu_with_none_of_the_ops_gives_an_empty_table(monkeypatch) -> None:
    install(monkeypatch, missing=["npu_fused_infer_attention_score", "_npu_paged_attention",
                                  "npu_scatter_pa_kv_cache", "_npu_reshape_and_cache", "npu_rms_norm",
                                  "npu_add_rms_norm", "npu_apply_rotary_pos_emb", "_npu_rotary_embedding"])
    assert npu_op_overrides() == {}
    assert all(npu_op_report()[op].startswith("reference: torch_npu has no") for op in NPU_OPS)
