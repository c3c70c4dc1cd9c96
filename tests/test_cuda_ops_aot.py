"""Every Triton kernel variant hyspec launches compiles for sm_90a / sm_80 here, with no GPU (hyspec.cuda_ops.aot).

Default tier: the launches are recorded (every kernel, gpu_check's GPU shapes and the serving paths) and the
rejection sampler's variants are compiled for sm_90a, checking its race fix in the PTX.  Slow tier
(``bash scripts/dev.sh test-slow``): every variant for both GPUs, and the spill budget against the table
in docs/cuda_kernels.md (``python scripts/cuda_aot_report.py`` rewrites it).
"""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

# find_spec, not importorskip: importing triton here, before the interpreter tests set TRITON_INTERPRET=1,
# would leave triton.language's helpers compiled-only for the rest of this process
pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")

REPO = Path(__file__).resolve().parents[1]
KERNELS = {"_paged_attention_kernel", "_merge_partitions_kernel", "_scatter_kernel", "_gather_kernel",
           "_rms_norm_kernel", "_rotary_kernel", "_rejection_sample_kernel"}

RECORD = """
import sys
from pathlib import Path
from hyspec.cuda_ops.aot import record_launches, save_variants
from hyspec.cuda_ops.aot_workloads import launch_all
with record_launches(execute=False) as seen:
    launch_all()
save_variants(seen, Path(sys.argv[1]))
"""
COMPILE = """
import json, sys
from dataclasses import asdict
from pathlib import Path
from hyspec.cuda_ops.aot import compile_variant, load_variants
wanted = set(sys.argv[3].split(","))
needles = sys.argv[4].split(";") if len(sys.argv) > 4 else []  # every one must occur in the variant's label
variants = [v for v in load_variants(Path(sys.argv[1])) if v.kernel in wanted and all(n in v.label() for n in needles)]
print(json.dumps([dict(asdict(compile_variant(v, int(sys.argv[2]))), has_q=dict(v.constexprs).get("HAS_Q"))
                  for v in variants]))
"""


def _env(interpret: bool) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = "1"
    if interpret:
        env["TRITON_INTERPRET"] = "1"
    return env


@pytest.fixture(scope="module")
def variants_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("aot") / "variants.json"
    r = subprocess.run([sys.executable, "-c", RECORD, str(path)], capture_output=True, text=True, timeout=600,
                       env=_env(interpret=True), cwd=REPO)
    assert r.returncode == 0, r.stderr[-3000:]
    return path


def _compile(variants_file: Path, arch: int, kernels: set[str], needles: tuple[str, ...] = ()) -> list[dict]:
    r = subprocess.run([sys.executable, "-c", COMPILE, str(variants_file), str(arch), ",".join(sorted(kernels)),
                        *([";".join(needles)] if needles else [])],
                       capture_output=True, text=True, timeout=1800, env=_env(interpret=False), cwd=REPO)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout)


def test_every_kernel_is_recorded_with_its_serving_variants(variants_file: Path) -> None:
    variants = json.loads(variants_file.read_text())
    assert {v["kernel"] for v in variants} == KERNELS
    assert len(variants) >= 50
    attention = [dict(v["constexprs"]) for v in variants if v["kernel"] == "_paged_attention_kernel"]
    assert {c["HAS_TREE"] for c in attention} == {True, False} and {c["SPLIT"] for c in attention} == {True, False}
    assert {c["OUT_DTYPE"]["dtype"] for c in attention} == {"bf16", "fp16", "fp32"}
    assert all(c["SOFT_BF16"] is False for c in attention)  # recorded as the GPU path launches them
    sampler = [v for v in variants if v["kernel"] == "_rejection_sample_kernel"]
    assert {dict(v["constexprs"])["HAS_Q"] for v in sampler} == {True, False}
    assert all(dict(v["options"]).get("enable_fp_fusion") is False for v in sampler)


def test_the_rejection_sampler_compiles_for_sm90a_without_its_race(variants_file: Path) -> None:
    """One-hot drafts: the only global stores are the two outputs (no scratch row shared between warps).
    Stored q rows: the scratch row's writes are fenced, so the PTX holds more barriers than the reductions
    alone need (the one-hot variant of the same tree shape)."""
    results = _compile(variants_file, 90, {"_rejection_sample_kernel"})
    assert results and all(r["ok"] for r in results), [r["error"] for r in results]
    for r in results:
        assert r["spill_store_bytes"] == 0, r
        if not r["has_q"]:
            assert r["global_stores"] == 2, r
    one_hot = [r for r in results if not r["has_q"]]
    stored = [r for r in results if r["has_q"]]
    assert one_hot and stored  # N, C, max_depth are not specialised: one binary each for chains and trees
    assert min(s["bar_sync"] for s in stored) > max(o["bar_sync"] for o in one_hot)


def test_prefill_tiles_reach_wgmma_and_wide_heads_do_not_spill(variants_file: Path) -> None:
    """sm_90a: the default model's bf16 prefill chunks (64-row tiles, 8 warps) compile to Hopper's warpgroup MMA
    with no spills; the D = 128 bf16 decode / verification variants (8 warps) spill nothing (4 warps spilled
    116-280 bytes each)."""
    prefill = _compile(variants_file, 90, {"_paged_attention_kernel"},
                       ("BLOCK_M=64", "D_PAD=64", "HAS_TREE=False", "SPLIT=False", "OUT_DTYPE=bf16"))
    assert prefill and all(r["ok"] and r["extra"]["wgmma"] > 0 and r["spill_store_bytes"] == 0 for r in prefill), \
        prefill
    wide = _compile(variants_file, 90, {"_paged_attention_kernel"},
                    ("BLOCK_M=32", "BLOCK_N=32", "D_PAD=128", "SPLIT=True", "OUT_DTYPE=bf16", "num_warps=8"))
    assert wide and all(r["ok"] and r["spill_store_bytes"] == 0 for r in wide), wide


@pytest.mark.slow
@pytest.mark.parametrize("arch", [90, 80])
def test_every_variant_compiles_and_spills_only_where_documented(variants_file: Path, arch: int) -> None:
    from hyspec.cuda_ops.aot import SPILL_BUDGET_BYTES

    results = _compile(variants_file, arch, KERNELS)
    failed = [(r["variant"], r["error"]) for r in results if not r["ok"]]
    assert not failed
    table = (REPO / "docs" / "cuda_kernels.md").read_text()
    for r in results:
        if (r["spill_store_bytes"] or 0) > SPILL_BUDGET_BYTES:
            assert f"`{r['variant']}` | {r['arch']} |" in table and "**over**" in table, r["variant"]
