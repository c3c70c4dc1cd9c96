"""The ONNX Runtime drafter: export, numerics against the torch drafter, caching, threads, bad input.

Logits are compared with hyspec.cpu_ops.onnx_check's fp32 tolerance
(1e-4 + 1e-4 |ref|; why: see that module) over prefill, greedy steps and a
roll-back, on tiny checkpoints of several families: GQA ratios 1, 2 and 4,
q/k norms, qkv bias, tied embeddings and llama3 RoPE scaling.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")

from hyspec.cpu_ops.onnx_check import ATOL, check_against_torch  # noqa: E402
from hyspec.cpu_ops.onnx_drafter import (OnnxDraftModel, cached_export, drafter_fingerprint,  # noqa: E402
                                         export_draft_model)
from hyspec.cpu_ops.onnx_export import export_onnx, read_metadata  # noqa: E402
from hyspec.cpu_ops.onnx_runtime import OnnxModule, OnnxUnavailableError  # noqa: E402
from hyspec.errors import CheckpointError, HyspecError  # noqa: E402
from hyspec.model.loader import load_model  # noqa: E402
from tests.model.tiny_checkpoint import make_checkpoint  # noqa: E402

PROMPTS = [[5, 6, 7, 8, 9], [10, 11], [3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13]]  # ragged on purpose


@pytest.fixture(scope="module")
def drafter_dir(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("onnx_drafter")
    make_checkpoint(path, "llama_gqa", layers=2, seed=3)
    return path


@pytest.fixture(scope="module")
def onnx_bytes(drafter_dir) -> bytes:
    return export_draft_model(drafter_dir)


@pytest.mark.parametrize("family", ["llama_gqa", "llama3_rope", "qwen3", "qwen2"])
def test_matches_torch_over_prefill_steps_and_rollback(tmp_path, family):
    make_checkpoint(tmp_path, family, layers=2, seed=1)
    model = load_model(tmp_path, dtype="float32")
    onnx = OnnxDraftModel(export_draft_model(tmp_path), num_threads=1)
    result = check_against_torch(model, onnx, PROMPTS, steps=6, rollback_after=2)
    assert result.passed, result
    assert result.compared_rows == 7 * len(PROMPTS)
    assert result.max_abs_error < ATOL


def test_bf16_checkpoint_is_exported_in_fp32(tmp_path):
    make_checkpoint(tmp_path, "llama_gqa", layers=1, seed=2, dtype=torch.bfloat16)
    model = load_model(tmp_path, dtype="float32")  # the fp32 view of the bf16 weights is what was exported
    result = check_against_torch(model, OnnxDraftModel(export_draft_model(tmp_path)), PROMPTS[:2], steps=3)
    assert result.passed, result


def test_holes_are_squeezed_and_results_unchanged(drafter_dir, onnx_bytes):
    """Many roll-backs leave masked holes; the runner drops them and the logits stay right."""
    model = load_model(drafter_dir, dtype="float32")
    onnx = OnnxDraftModel(onnx_bytes)
    seq = [7, 8, 9]
    logits, state = onnx.prefill([seq])
    for _ in range(30):
        draft = int(logits[0].argmax())
        _, state = onnx.step([draft], state)  # a draft...
        _, state = onnx.step([(draft + 1) % 320], state)  # ...and another, both rejected
        state = onnx.rollback(state, [len(seq)])
        seq.append((len(seq) * 37) % 300 + 3)  # the "target" picks something else
        logits, state = onnx.step([seq[-1]], state)
    assert state.num_columns <= 2 * max(len(seq), 8)
    with torch.no_grad():
        expected = model.compute_logits(model.forward_dense(torch.tensor([seq])).hidden[0, -1:])[0]
    assert torch.allclose(logits[0], expected, atol=ATOL, rtol=1e-4)


def test_batched_rows_match_single_rows(onnx_bytes):
    onnx = OnnxDraftModel(onnx_bytes)
    batched, state = onnx.prefill(PROMPTS)
    batched2, _ = onnx.step([1, 2, 3], state)
    for b, prompt in enumerate(PROMPTS):
        single, st = onnx.prefill([prompt])
        single2, _ = onnx.step([b + 1], st)
        assert torch.allclose(batched[b], single[0], atol=1e-5)
        assert torch.allclose(batched2[b], single2[0], atol=1e-5)


def test_thread_counts_give_the_same_logits(onnx_bytes):
    onnx = OnnxDraftModel(onnx_bytes, num_threads=1)
    one, _ = onnx.prefill(PROMPTS)
    onnx.set_num_threads(2)
    assert onnx.module.num_threads == 2
    two, _ = onnx.prefill(PROMPTS)
    assert torch.allclose(one, two, atol=1e-5)
    with pytest.raises(HyspecError, match="num_threads"):
        onnx.set_num_threads(0)


def test_export_metadata_names_the_weights(drafter_dir, onnx_bytes):
    meta = read_metadata(onnx_bytes)
    assert meta["hyspec.weights_sha256"] == drafter_fingerprint(drafter_dir)
    assert meta["hyspec.exporter"] == "torchscript"
    assert OnnxDraftModel(onnx_bytes).weights_sha256 == drafter_fingerprint(drafter_dir)


def test_cached_export_is_reused_and_rebuilt_when_weights_change(tmp_path, monkeypatch):
    monkeypatch.setenv("HYSPEC_CACHE", str(tmp_path / "user_cache"))
    drafter = tmp_path / "drafter"
    make_checkpoint(drafter, "llama_gqa", layers=1, seed=4)
    first = cached_export(drafter)
    assert first.parent == drafter / "onnx" and drafter_fingerprint(drafter)[:16] in first.name
    stamp = first.stat().st_mtime_ns
    assert cached_export(drafter) == first and first.stat().st_mtime_ns == stamp  # reused, not re-exported

    make_checkpoint(drafter, "llama_gqa", layers=1, seed=5)  # new weights in the same folder
    second = cached_export(drafter)
    assert second != first and not first.exists()  # the stale export is gone
    model = load_model(drafter, dtype="float32")
    assert check_against_torch(model, OnnxDraftModel.from_drafter_dir(drafter), PROMPTS[:1], steps=2).passed


def test_unwritable_drafter_folder_uses_the_user_cache(tmp_path, monkeypatch):
    cache = tmp_path / "user_cache"
    monkeypatch.setenv("HYSPEC_CACHE", str(cache))
    drafter = tmp_path / "drafter"
    make_checkpoint(drafter, "llama_gqa", layers=1, seed=6)
    (drafter / "onnx").write_text("a file where the folder would go")  # mkdir fails, as on a read-only install
    path = cached_export(drafter)
    assert path.parent == cache / "onnx" and path.is_file()
    assert cached_export(drafter) == path


def test_bad_input_is_named(tmp_path, onnx_bytes):
    onnx = OnnxDraftModel(onnx_bytes)
    _, state = onnx.prefill(PROMPTS)
    with pytest.raises(HyspecError, match="3 rows"):
        onnx.step([1, 2], state)
    with pytest.raises(HyspecError, match=r"outside \[0, 320\)"):
        onnx.step([1, 2, 320], state)
    with pytest.raises(HyspecError, match="at least one new token"):
        onnx.feed([[1], [], [2]], state)
    with pytest.raises(HyspecError, match="rollback"):
        onnx.rollback(state, [100, 1, 1])
    with pytest.raises(CheckpointError, match="config.json"):
        export_draft_model(tmp_path)
    with pytest.raises(HyspecError, match="does not exist"):
        OnnxDraftModel(tmp_path / "missing.onnx")


def test_a_foreign_graph_is_refused():
    data = export_onnx(torch.nn.Linear(4, 2), (torch.zeros(1, 4),), ["x"], ["y"], {"x": {0: "b"}})
    with pytest.raises(HyspecError, match="not a hyspec draft-model graph"):
        OnnxDraftModel(data)


def test_generic_module_runner():
    class Affine(torch.nn.Module):
        def forward(self, x, shift):
            return x * 2 + shift, x.sum(dim=-1)

    data = export_onnx(Affine(), (torch.ones(2, 3), torch.ones(2, 3)), ["x", "shift"], ["y", "total"],
                       {"x": {0: "b"}, "shift": {0: "b"}, "y": {0: "b"}, "total": {0: "b"}},
                       metadata={"purpose": "test"})
    module = OnnxModule(data, num_threads=1)
    assert module.input_names == ("x", "shift") and module.metadata["purpose"] == "test"
    x = torch.arange(12, dtype=torch.float32).reshape(4, 3)
    y, total = module(x, torch.ones(4, 3))
    assert torch.equal(y, x * 2 + 1) and torch.equal(total, x.sum(-1))
    assert torch.equal(module.run({"x": x, "shift": x})["y"], x * 3)
    with pytest.raises(HyspecError, match="missing"):
        module.run({"x": x})
    with pytest.raises(HyspecError, match="takes 2 inputs"):
        module(x)


def test_dynamo_exporter_without_onnxscript_says_so():
    try:
        import onnxscript  # noqa: F401
        pytest.skip("onnxscript is installed: the dynamo exporter is available here")
    except ImportError:
        pass
    with pytest.raises(OnnxUnavailableError, match="onnxscript"):
        export_onnx(torch.nn.Linear(2, 2), (torch.zeros(1, 2),), ["x"], ["y"], {}, exporter="dynamo")


@pytest.mark.slow
def test_dynamo_exporter_matches_torch(drafter_dir):
    pytest.importorskip("onnxscript")
    onnx = OnnxDraftModel(export_draft_model(drafter_dir, exporter="dynamo"))
    assert read_metadata(export_draft_model(drafter_dir))["hyspec.exporter"] == "torchscript"
    assert onnx.module.metadata["hyspec.exporter"] == "dynamo"
    result = check_against_torch(load_model(drafter_dir, dtype="float32"), onnx, PROMPTS, steps=4)
    assert result.passed, result


def test_missing_onnxruntime_names_the_cpu_extra(monkeypatch, onnx_bytes):
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # import onnxruntime now raises ImportError
    with pytest.raises(OnnxUnavailableError, match=r"hyspec\[cpu\]"):
        OnnxDraftModel(onnx_bytes)


def test_importing_the_modules_does_not_import_onnxruntime():
    code = ("import sys, hyspec.cpu_ops.onnx_drafter, hyspec.cpu_ops.onnx_check; "
            "sys.exit(1 if 'onnxruntime' in sys.modules or 'onnx' in sys.modules else 0)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
