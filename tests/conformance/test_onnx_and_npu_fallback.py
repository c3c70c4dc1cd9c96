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
        "npu_fused_infer_attention_score", "_npu_paged_attention", "npu_apply_rotary_pos_emb", "npu_rotary_mul",
        "_npu_rotary_embedding"]))
    backend = CPUBackend(probe_cpu())
    backend.ops = resolve_ops("hyspec.npu_ops", "npu_op_overrides", source="torch_npu").table
    target = Target("npu", "emulated torch_npu", torch.device("cpu"), backend, op_notes("npu", backend))
    ops = check_ops(target, quick=True)
    assert {op: r.source for op, r in ops.items()} == {
        "attention": "reference", "write_kv": "torch_npu", "compact_kv": "reference", "rms_norm": "torch_npu",
        "rotary": "reference", "logits": "reference", "sample": "reference", "rejection_sample": "reference"}
    assert "torch_npu has no npu_fused_infer_attention_score" in ops["attention"].note
    assert "torch_npu has no npu_apply_rotary_pos_emb" in ops["rotary"].note
    for result in ops.values():
        assert_passed(result)
    assert {c.origin for c in ops["write_kv"].cases} == {"hyspec.npu_ops.tolerances"}


@pytest.mark.parametrize("version", ["7.1.0", "26.1.0"])
def test_each_release_passes_the_op_checks_on_its_own_variants(monkeypatch, version):
    """The pinned release and an older one (op-plugin 7.1.0: no rotary_mode, no scatter, no TND PageAttention):
    the plan picks what each documents, nothing raises, and every op meets the NPU tolerance table."""
    module = fake_torch_npu(version=version)
    monkeypatch.setitem(sys.modules, "torch_npu", module)
    backend = CPUBackend(probe_cpu())
    backend.ops = resolve_ops("hyspec.npu_ops", "npu_op_overrides", source="torch_npu").table
    target = Target("npu", f"emulated op-plugin {version}", torch.device("cpu"), backend, op_notes("npu", backend))
    ops = check_ops(target, quick=True)
    for result in ops.values():
        assert_passed(result)
    served = {name for name, *_ in module.calls}
    if version == "7.1.0":
        assert "npu_rotary_mul" in served and "npu_apply_rotary_pos_emb" not in served
        assert "_npu_reshape_and_cache" in served
        assert all(kw.get("input_layout") != "TND" for name, _, kw in module.calls
                   if name == "npu_fused_infer_attention_score")
    else:
        assert {"npu_apply_rotary_pos_emb", "npu_scatter_pa_kv_cache"} <= served
    layouts = {kw["input_layout"] for name, _, kw in module.calls if name == "npu_fused_infer_attention_score"}
    assert "BSND" in layouts  # the D = 64 shapes (SmolLM2) and trees
