"""torch_npu fused ops for the Ascend NPU backend, each taking its reference op's signature.

NOTHING IN THIS PACKAGE HAS RUN ON ASCEND HARDWARE.  It is written against
the documented torch_npu APIs as vllm-ascend uses them (docs/npu.md lists
the sources); the argument plumbing is tested on CPU against pure-torch
emulations of the documented semantics (``hyspec.npu_ops.emulation``), and
the conformance suite on an Ascend machine is what will show the kernels
agree with the references.

Importing this package imports neither torch_npu nor anything that needs
it; ``npu_op_overrides()`` imports torch_npu and lets ``plan.plan`` choose
per op: a function is used only when the installed signature takes hyspec's
keywords, its op-plugin release documents the call and (ATB ops) libatb
answered a start-up call; everything else falls back per op.

==========  ===========================================================  ==========================
op          torch_npu function(s)                                        wrapper
==========  ===========================================================  ==========================
attention   ``npu_fused_infer_attention_score`` (causal: TND sparse_mode ``attention.NpuAttention``
            3 where documented for D, else BSND; trees: BSND, explicit
            mask), plus ``_npu_paged_attention`` for single-token decode
write_kv    ``npu_scatter_pa_kv_cache``, else ``_npu_reshape_and_cache``  ``kv.NpuWriteKV``
rms_norm    ``npu_rms_norm``, ``npu_add_rms_norm`` (with residual)         ``norm.NpuRmsNorm``
rotary      ``npu_apply_rotary_pos_emb`` (D 64/128), ``npu_rotary_mul``,  ``rotary.NpuRotary``
            ``_npu_rotary_embedding`` (one RoPE table per process)
==========  ===========================================================  ==========================

``compact_kv``, ``sample`` and ``rejection_sample`` stay on their reference
versions (plain torch indexing and sampling run on the NPU as they are).
"""
from __future__ import annotations

from typing import Callable

from hyspec.ops import OP_NAMES

#: ops hyspec.npu_ops can back with torch_npu; the others always run their reference
NPU_OPS = ("attention", "write_kv", "rms_norm", "rotary")
_NO_NPU_VERSION = "reference: hyspec uses no torch_npu op for this (plain torch on the NPU)"


def npu_op_overrides(device=None) -> dict[str, Callable]:
    """The ops the installed torch_npu can back, keyed by ``OpTable`` op name (absent ops fall back).

    Which function serves each op is ``hyspec.npu_ops.plan.plan``'s choice
    (signatures, documented limits, ATB loaded or not).  Raises ImportError
    when torch_npu cannot be imported.
    """
    from hyspec.npu_ops.detect import import_torch_npu
    from hyspec.npu_ops.plan import plan

    return build_ops(plan(import_torch_npu(), device))


def build_ops(p) -> dict[str, Callable]:
    """The op wrappers for a plan (hyspec.npu_ops.plan.NpuPlan): only the functions it found usable."""
    from hyspec.npu_ops.attention import NpuAttention
    from hyspec.npu_ops.kv import NpuWriteKV
    from hyspec.npu_ops.norm import NpuRmsNorm
    from hyspec.npu_ops.rotary import NpuRotary

    fns = p.functions
    ops: dict[str, Callable] = {}
    if "fia" in fns or "paged_attention" in fns:
        ops["attention"] = NpuAttention(fns.get("fia"), fns.get("paged_attention"), limits=p.release)
    if "scatter_pa_kv_cache" in fns or "reshape_and_cache" in fns:
        ops["write_kv"] = NpuWriteKV(fns.get("scatter_pa_kv_cache"), fns.get("reshape_and_cache"))
    if "rms_norm" in fns or "add_rms_norm" in fns:
        ops["rms_norm"] = NpuRmsNorm(fns.get("rms_norm"), fns.get("add_rms_norm"))
    if any(k in fns for k in ("apply_rotary_pos_emb", "rotary_mul", "rotary_embedding")):
        ops["rotary"] = NpuRotary(fns.get("apply_rotary_pos_emb"), fns.get("rotary_embedding"),
                                  rotary_mul=fns.get("rotary_mul"), limits=p.release)
    return ops


def npu_op_plan(device=None) -> dict:
    """The plan as data (``hyspec probe --json``'s ``npu.ops``), or why there is none."""
    from hyspec.npu_ops.detect import import_torch_npu
    from hyspec.npu_ops.plan import plan

    try:
        module = import_torch_npu()
    except ImportError as exc:
        return {"error": f"torch_npu cannot be imported ({exc})"}
    return plan(module, device).to_dict()


def npu_op_report() -> dict[str, str]:
    """For every op name: the torch_npu function(s) backing it (in the order tried), or why it runs the reference."""
    from hyspec.npu_ops.detect import import_torch_npu
    from hyspec.npu_ops.plan import plan

    try:
        p = plan(import_torch_npu())
    except ImportError as exc:
        reason = f"reference: torch_npu cannot be imported ({exc})"
        return {name: (reason if name in NPU_OPS else _NO_NPU_VERSION) for name in OP_NAMES}
    report = {name: _NO_NPU_VERSION for name in OP_NAMES}
    report.update({op: op_plan.describe() for op, op_plan in p.ops.items()})
    return report


__all__ = ["NPU_OPS", "build_ops", "npu_op_overrides", "npu_op_plan", "npu_op_report"]
