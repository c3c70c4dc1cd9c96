"""torch_npu fused ops for the Ascend NPU backend, each taking its reference op's signature.

NOTHING IN THIS PACKAGE HAS RUN ON ASCEND HARDWARE.  It is written against
the documented torch_npu APIs as vllm-ascend uses them (docs/npu.md lists
the sources); the argument plumbing is tested on CPU against pure-torch
emulations of the documented semantics (``hyspec.npu_ops.emulation``), and
the conformance suite on an Ascend machine is what will show the kernels
agree with the references.

Importing this package imports neither torch_npu nor anything that needs
it; ``npu_op_overrides()`` imports torch_npu and looks every function up at
call time, so an older torch_npu missing an op falls back per op.

==========  ===========================================================  ==========================
op          torch_npu function(s)                                        wrapper
==========  ===========================================================  ==========================
attention   ``npu_fused_infer_attention_score`` (prefill, chains: TND,   ``attention.NpuAttention``
            sparse_mode 3; trees: BSND, explicit mask), plus
            ``_npu_paged_attention`` for all-single-token decode
write_kv    ``npu_scatter_pa_kv_cache``, else ``_npu_reshape_and_cache``  ``kv.NpuWriteKV``
rms_norm    ``npu_rms_norm``, ``npu_add_rms_norm`` (with residual)         ``norm.NpuRmsNorm``
rotary      ``npu_apply_rotary_pos_emb`` (D 64/128), else                 ``rotary.NpuRotary``
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


def npu_op_overrides() -> dict[str, Callable]:
    """The ops the installed torch_npu can back, keyed by ``OpTable`` op name (absent ops fall back).

    Raises ImportError when torch_npu cannot be imported.
    """
    from hyspec.npu_ops.detect import find_functions, import_torch_npu

    fns = find_functions(import_torch_npu())
    return _build(fns)


def _build(fns) -> dict[str, Callable]:
    from hyspec.npu_ops.attention import NpuAttention
    from hyspec.npu_ops.kv import NpuWriteKV
    from hyspec.npu_ops.norm import NpuRmsNorm
    from hyspec.npu_ops.rotary import NpuRotary

    ops: dict[str, Callable] = {}
    if fns.fia is not None:
        ops["attention"] = NpuAttention(fns.fia, fns.paged_attention)
    if fns.scatter_pa_kv_cache is not None or fns.reshape_and_cache is not None:
        ops["write_kv"] = NpuWriteKV(fns.scatter_pa_kv_cache, fns.reshape_and_cache)
    if fns.rms_norm is not None or fns.add_rms_norm is not None:
        ops["rms_norm"] = NpuRmsNorm(fns.rms_norm, fns.add_rms_norm)
    if fns.apply_rotary_pos_emb is not None or fns.rotary_embedding is not None:
        ops["rotary"] = NpuRotary(fns.apply_rotary_pos_emb, fns.rotary_embedding)
    return ops


def npu_op_report() -> dict[str, str]:
    """For every op name: the torch_npu function(s) backing it, or why it runs the reference."""
    from hyspec.npu_ops.detect import find_functions, import_torch_npu

    try:
        fns = find_functions(import_torch_npu())
    except ImportError as exc:
        reason = f"reference: torch_npu cannot be imported ({exc})"
        return {name: (reason if name in NPU_OPS else _NO_NPU_VERSION) for name in OP_NAMES}
    report = {name: _NO_NPU_VERSION for name in OP_NAMES}
    report.update(_describe(fns))
    return report


def _describe(fns) -> dict[str, str]:
    def missing(*which: str) -> str:
        return "reference: torch_npu has no " + " and no ".join(fns.name(w) for w in which)

    if fns.fia is None:
        attention = missing("fia")
    else:
        attention = f"{fns.name('fia')} (prefill, chains: TND sparse_mode 3; trees: BSND explicit mask)"
        attention += (f" + {fns.name('paged_attention')} (single-token decode)" if fns.paged_attention is not None
                      else f"; single-token decode also on FIA ({fns.name('paged_attention')} missing)")
    if fns.scatter_pa_kv_cache is not None:
        write_kv = f"{fns.name('scatter_pa_kv_cache')} (cache_mode='Norm')"
    elif fns.reshape_and_cache is not None:
        write_kv = f"{fns.name('reshape_and_cache')} (float32 caches: reference)"
    else:
        write_kv = missing("scatter_pa_kv_cache", "reshape_and_cache")
    if fns.rms_norm is None and fns.add_rms_norm is None:
        rms = missing("rms_norm", "add_rms_norm")
    else:
        parts = []
        parts.append(f"{fns.name('rms_norm')}" if fns.rms_norm else "no residual: reference (npu_rms_norm missing)")
        parts.append(f"{fns.name('add_rms_norm')} (with residual)" if fns.add_rms_norm
                     else "with residual: torch add + npu_rms_norm")
        rms = " + ".join(parts)
    if fns.apply_rotary_pos_emb is None and fns.rotary_embedding is None:
        rotary = missing("apply_rotary_pos_emb", "rotary_embedding")
    else:
        parts = []
        if fns.apply_rotary_pos_emb:
            parts.append(f"{fns.name('apply_rotary_pos_emb')} (head_dim 64/128)")
        if fns.rotary_embedding:
            parts.append(f"{fns.name('rotary_embedding')} (other head dims; the first RoPE table only)")
        rotary = ", else ".join(parts) + "; otherwise reference"
    return {"attention": attention, "write_kv": write_kv, "rms_norm": rms, "rotary": rotary}


__all__ = ["NPU_OPS", "npu_op_overrides", "npu_op_report"]
