"""Which ops the installed torch_npu backs: detection at call time, per-op fallback, the report, lazy imports."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from hyspec.backends.optable import resolve_ops
import torch

from hyspec.npu_ops import NPU_OPS, npu_op_overrides, npu_op_plan, npu_op_report
from hyspec.npu_ops.emulation import fake_torch_npu
from hyspec.npu_ops.op_schemas import (PINNED_BRANCH, Signature, branches, load_release, release_for_torch_npu,
                                       signature_of)
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
    install(monkeypatch)  # the pinned release (op-plugin 26.1.0), ATB loaded
    assert sorted(npu_op_overrides()) == sorted(NPU_OPS)
    table = resolve_ops("hyspec.npu_ops", "npu_op_overrides", source="torch_npu").table
    assert {op: table.sources[op] for op in OP_NAMES} == {
        op: ("torch_npu" if op in NPU_OPS else REFERENCE) for op in OP_NAMES}
    report = npu_op_report()
    assert report["attention"].startswith("torch_npu.npu_fused_infer_attention_score")
    assert "torch_npu._npu_paged_attention (single-token decode)" in report["attention"]
    assert report["write_kv"].startswith("torch_npu.npu_scatter_pa_kv_cache (cache_mode='Norm'), else "
                                         "torch_npu._npu_reshape_and_cache")
    assert report["rotary"].startswith("torch_npu.npu_apply_rotary_pos_emb (rotary_mode='half', head_dim 64/128), "
                                       "else torch_npu.npu_rotary_mul")
    assert "not used" not in " ".join(report.values())
    assert report["compact_kv"].startswith("reference: hyspec uses no torch_npu op")


def test_missing_functions_fall_back_per_op_and_say_which(monkeypatch) -> None:
    install(monkeypatch, missing=["npu_fused_infer_attention_score", "_npu_paged_attention",
                                  "npu_scatter_pa_kv_cache", "npu_apply_rotary_pos_emb", "npu_rotary_mul",
                                  "_npu_rotary_embedding", "npu_add_rms_norm"])
    ops = npu_op_overrides()
    assert sorted(ops) == ["rms_norm", "write_kv"]
    report = npu_op_report()
    assert report["attention"] == ("reference; not used: "
                                   "torch_npu.npu_fused_infer_attention_score (torch_npu has no "
                                   "npu_fused_infer_attention_score); torch_npu._npu_paged_attention "
                                   "(torch_npu has no _npu_paged_attention)")
    assert "torch_npu.npu_apply_rotary_pos_emb (torch_npu has no npu_apply_rotary_pos_emb)" in report["rotary"]
    assert report["write_kv"].startswith("torch_npu._npu_reshape_and_cache")
    table = resolve_ops("hyspec.npu_ops", "npu_op_overrides", source="torch_npu").table
    assert table.sources["attention"] == REFERENCE and table.sources["write_kv"] == "torch_npu"


def test_decode_without_paged_attention_is_reported(monkeypatch) -> None:
    install(monkeypatch, missing=["_npu_paged_attention"])
    assert "attention" in npu_op_overrides()
    report = npu_op_report()["attention"]
    assert "else torch_npu._npu_paged_attention" not in report
    assert "not used: torch_npu._npu_paged_attention (torch_npu has no _npu_paged_attention)" in report


def test_a_torch_npu_with_none_of_the_ops_gives_an_empty_table(monkeypatch) -> None:
    install(monkeypatch, missing=["npu_fused_infer_attention_score", "_npu_paged_attention",
                                  "npu_scatter_pa_kv_cache", "_npu_reshape_and_cache", "npu_rms_norm",
                                  "npu_add_rms_norm", "npu_apply_rotary_pos_emb", "npu_rotary_mul",
                                  "_npu_rotary_embedding"])
    assert npu_op_overrides() == {}
    assert all(npu_op_report()[op].startswith("reference; not used:") for op in NPU_OPS)


# --- ops chosen by signature, documented limits and ATB's state (issue: Ascend, for real) ----------------------

def test_older_release_signatures_reject_todays_calls_and_the_pinned_ones_accept_them() -> None:
    """op-plugin 7.1.0's signatures refuse rotary_mode / cache_mode (TypeError, as torch_npu's parser does)."""
    old, pinned = fake_torch_npu(version="7.1.0"), fake_torch_npu(version=PINNED_BRANCH)
    q, k = torch.randn(1, 3, 2, 64, dtype=torch.bfloat16), torch.randn(1, 3, 1, 64, dtype=torch.bfloat16)
    cos, sin = torch.ones(1, 3, 1, 64, dtype=torch.bfloat16), torch.zeros(1, 3, 1, 64, dtype=torch.bfloat16)
    with pytest.raises(TypeError, match="unexpected keyword argument 'rotary_mode'"):
        old.npu_apply_rotary_pos_emb(q.clone(), k.clone(), cos, sin, rotary_mode="half")
    pinned.npu_apply_rotary_pos_emb(q.clone(), k.clone(), cos, sin, layout="BSND", rotary_mode="half")
    assert not hasattr(old, "npu_scatter_pa_kv_cache")  # absent before 26.0.0's signature with cache_mode
    key, cache = torch.randn(2, 1, 8), torch.zeros(2, 16, 1, 8)
    pinned.npu_scatter_pa_kv_cache(key, key, cache, cache.clone(), torch.tensor([0, 3]), cache_mode="Norm")
    assert torch.equal(cache[0, 3], key[1])


def test_cache_mode_is_refused_by_a_scatter_that_lacks_it(monkeypatch) -> None:
    """op-plugin 7.2.0 / 7.3.0: npu_scatter_pa_kv_cache exists but hard-wires PA_NZ (no cache_mode keyword).

    The schema is 7.2.0's, verbatim (op_plugin/config/op_plugin_functions.yaml @ 738effc0fe0d).
    """
    module = fake_torch_npu()
    no_mode = "npu_scatter_pa_kv_cache(Tensor key, Tensor value, Tensor(a!) key_cache, Tensor(b!) value_cache, " \
              "Tensor slot_mapping, *, Tensor? compress_lens=None, Tensor? compress_seq_offsets=None, " \
              "Tensor? seq_lens=None) -> ()"
    with pytest.raises(TypeError, match="unexpected keyword argument 'cache_mode'"):
        Signature.from_schema(no_mode).bind((1, 2, 3, 4, 5), {"cache_mode": "Norm"})  # today's call, refused
    module.npu_scatter_pa_kv_cache._schema = torch._C.parse_schema(no_mode)
    monkeypatch.setitem(sys.modules, "torch_npu", module)
    report = npu_op_report()["write_kv"]
    assert report.startswith("torch_npu._npu_reshape_and_cache")
    assert "torch_npu.npu_scatter_pa_kv_cache takes no cache_mode in this torch_npu" in report


def test_the_older_release_gets_fallbacks_and_nothing_raises(monkeypatch) -> None:
    install(monkeypatch, version="7.1.0")
    plan_ = npu_op_plan()
    assert plan_["op_plugin"].startswith("op-plugin 7.1.0 @ 57c52665a1")
    rotary = plan_["ops"]["rotary"]
    assert rotary["uses"][0].startswith("torch_npu.npu_rotary_mul")
    assert "takes no rotary_mode" in rotary["rejected"]["torch_npu.npu_apply_rotary_pos_emb"]
    assert plan_["ops"]["write_kv"]["uses"][0].startswith("torch_npu._npu_reshape_and_cache")
    assert "TND with PageAttention is not documented here" in plan_["ops"]["attention"]["uses"][0]
    assert "not documented in op-plugin 7.1.0" in plan_["ops"]["rms_norm"]["rejected"]["torch_npu.npu_add_rms_norm"]


def test_without_nnal_the_atb_ops_are_not_used_and_the_probe_says_how_to_fix_it(monkeypatch) -> None:
    module = install(monkeypatch, atb_loaded=False)
    plan_ = npu_op_plan()
    assert plan_["atb"]["loaded"] is False
    assert "nnal package is installed" in plan_["atb"]["detail"]
    assert "source /usr/local/Ascend/nnal/atb/set_env.sh" in plan_["atb"]["detail"]
    for op, name in [("attention", "_npu_paged_attention"), ("write_kv", "_npu_reshape_and_cache"),
                     ("rotary", "_npu_rotary_embedding")]:
        assert "ATB not loaded" in plan_["ops"][op]["rejected"][f"torch_npu.{name}"]
    assert [c[0] for c in module.calls] == ["_npu_reshape_and_cache"]  # the one start-up call, which failed


def test_signatures_are_read_from_torchs_operator_registry() -> None:
    """A real torch_npu registers its ops with the dispatcher: the schema comes from there, not from our data."""
    lib = torch.library.Library("hyspec_sigtest", "DEF")
    lib.define("npu_rotary_mul(Tensor self, Tensor r1, Tensor r2, str rotary_mode='half') -> Tensor")
    packet = torch.ops.hyspec_sigtest.npu_rotary_mul
    sig = signature_of(packet, "hyspec_sigtest", "npu_rotary_mul")
    assert sig.positional == ("self", "r1", "r2", "rotary_mode") and sig.accepts("rotary_mode")
    assert not sig.accepts("rotate")
    by_name = signature_of(lambda *a: None, "hyspec_sigtest", "npu_rotary_mul")  # a C binding: registry lookup
    assert by_name == sig
    assert signature_of(lambda *a, **k: None, "hyspec_sigtest", "nothing") is None  # unreadable: not used


def test_the_release_data_records_its_sources() -> None:
    for branch in branches():
        release = load_release(branch)
        assert len(release.commit) == 40 and release.torch_npu and release.functions
        for name, text in release.functions.items():
            assert Signature.from_schema(text).name == name.split(".")[0]
    assert load_release(PINNED_BRANCH).torch_npu[0] == "2.10.0.post4"
    assert release_for_torch_npu("2.10.0.post4").branch == PINNED_BRANCH
    assert release_for_torch_npu("2.5.1").branch == "7.1.0"
    assert release_for_torch_npu("9.9.9") is None


def test_a_live_op_without_a_readable_schema_uses_its_releases_signature(monkeypatch) -> None:
    """A C binding with no schema in torch's registry: the signature of the op-plugin release this torch_npu
    ships stands in (and the plan says so); for a torch_npu hyspec has no data for, the op is not used."""
    module = fake_torch_npu(version="7.1.0")
    module.npu_rotary_mul = lambda *args, **kwargs: None  # no _schema, *args/**kwargs: what a C binding shows
    monkeypatch.setitem(sys.modules, "torch_npu", module)
    plan_ = npu_op_plan()
    assert plan_["signatures"]["rotary_mul"].endswith("[from op-plugin 7.1.0 data: the live op has none]")
    assert plan_["ops"]["rotary"]["uses"][0].startswith("torch_npu.npu_rotary_mul")
    module.__version__ = "9.9.9"  # unknown release: no data to trust
    plan_ = npu_op_plan()
    assert "signature cannot be read" in plan_["ops"]["rotary"]["rejected"]["torch_npu.npu_rotary_mul"]
