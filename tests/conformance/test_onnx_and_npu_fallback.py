"""The ONNX Runtime drafter row of the CPU report, and an older torch_npu (emulated) reported op by op."""
from __future__ import annotations

import sys

import pytest
import torch

from hyspec.backends.cpu import CPUBackend
from hyspec.backends.optable import resolve_ops
from hyspec.backends.probe import probe_cpu
from hyspec.conformance.op_checks import check_ops
from hyspec.conformance.runner import check_onnx_drafter
from hyspec.conformance.targets import Target, op_notes
from hyspec.npu_ops.emulation import fake_torch_npu
from tests.conformance.conftest import assert_passed


def test_onnx_drafter_matches_the_torch_drafter(workspace):
    pytest.importorskip("onnxruntime")
    result = check_onnx_drafter(workspace)
    assert_passed(result)
    assert result.cases[0].max_error < result.cases[0].atol


def test_an_older_torch_npu_reports_which_ops_fall_back(monkeypatch):
    """torch_npu without FIA and without the RoPE ops: attention and rotary run the reference, and say why.

    The emulation is our reading of the documented semantics, not the real
    kernels; what this shows is the report, and that the ops the emulated
    torch_npu does serve meet the NPU tolerance table through the wrappers.
    """
    monkeypatch.setitem(sys.modules, "torch_npu", fake_torch_npu(missing=[
        "npu_fused_infer_attention_score", "npu_apply_rotary_pos_emb", "_npu_rotary_embedding"]))
    backend = CPUBackend(probe_cpu())
    backend.ops = resolve_ops("hyspec.npu_ops", "npu_op_overrides", source="torch_npu").table
    target = Target("npu", "emulated torch_npu", torch.device("cpu"), backend, op_notes("npu", backend))
    ops = check_ops(target, quick=True)
    assert {op: r.source for op, r in ops.items()} == {
        "attention": "reference", "write_kv": "torch_npu", "compact_kv": "reference", "rms_norm": "torch_npu",
        "rotary": "reference", "logits": "reference", "sample": "reference", "rejection_sample": "reference"}
    assert "no torch_npu.npu_fused_infer_attention_score" in ops["attention"].note
    assert "no torch_npu.npu_apply_rotary_pos_emb" in ops["rotary"].note
    for result in ops.values():
        assert_passed(result)
    assert {c.origin for c in ops["write_kv"].cases} == {"hyspec.npu_ops.tolerances"}
