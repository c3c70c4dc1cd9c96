"""Which torch_npu function serves each hyspec op, chosen by signature, documented limits and ATB's state.

``plan(torch_npu, device)`` looks every function up (hyspec.npu_ops.detect),
reads its signature (hyspec.npu_ops.op_schemas), finds the op-plugin branch
the installed torch_npu was built from (its documented limits), makes one tiny
ATB call to see whether NNAL's libatb is loaded, and returns per op the
variants it will use, in the order they are tried per call, and why every
other variant was rejected.  The probe prints this (``hyspec probe --json``:
``npu.ops``) and ``npu_op_overrides`` builds the op table from it, so what
the report says is what runs.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Callable

import torch

from hyspec.npu_ops.detect import FUNCTIONS, NpuFunctions, find_functions
from hyspec.npu_ops.op_schemas import (PINNED_BRANCH, OpPluginRelease, Signature, load_release,
                                       release_for_torch_npu, signature_of)

log = logging.getLogger(__name__)

ATB_HINT = ("NNAL's ATB library is not loaded: source /usr/local/Ascend/nnal/atb/set_env.sh (after "
            "ascend-toolkit/set_env.sh) before starting hyspec; without it the _npu_* ATB ops are not used")
REFERENCE = "reference"

#: the keywords hyspec passes to each function (what its signature must take)
KEYWORDS: dict[str, tuple[str, ...]] = {
    "fia": ("atten_mask", "block_table", "input_layout", "actual_seq_lengths", "actual_seq_lengths_kv",
            "sparse_mode", "block_size", "num_heads", "num_key_value_heads", "scale"),
    "paged_attention": ("query", "key_cache", "value_cache", "num_kv_heads", "num_heads", "scale_value",
                        "block_table", "context_lens", "out"),
    "scatter_pa_kv_cache": ("key", "value", "key_cache", "value_cache", "slot_mapping", "cache_mode"),
    "reshape_and_cache": ("key", "value", "key_cache", "value_cache", "slot_indices"),
    "rms_norm": ("self", "gamma", "epsilon"),
    "add_rms_norm": ("x1", "x2", "gamma", "epsilon"),
    "apply_rotary_pos_emb": ("query", "key", "cos", "sin", "layout", "rotary_mode"),
    "rotary_mul": ("self", "r1", "r2", "rotary_mode"),
    "rotary_embedding": ("positions", "query", "key", "head_size", "cos_sin_cache", "is_neox_style"),
}
ATB_FIELDS = ("paged_attention", "reshape_and_cache", "rotary_embedding")


@dataclass(frozen=True)
class AtbStatus:
    loaded: bool
    detail: str  # what the start-up call did, or the error it raised


@dataclass
class OpPlan:
    """One hyspec op: the variants used (tried in order per call) and the rejected ones with reasons."""

    uses: list[str] = field(default_factory=list)
    rejected: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"uses": list(self.uses), "rejected": dict(self.rejected)}

    def describe(self) -> str:
        text = ", else ".join(self.uses)
        if self.rejected:
            text += "; not used: " + "; ".join(f"{k} ({v})" for k, v in self.rejected.items())
        return text


@dataclass
class NpuPlan:
    torch_npu_version: str | None
    release: OpPluginRelease
    release_note: str  # how the branch was chosen
    atb: AtbStatus
    functions: dict[str, Callable]  # usable functions by detect.FUNCTIONS field
    signatures: dict[str, str]  # field -> the signature text read from the installed op
    ops: dict[str, OpPlan]

    def to_dict(self) -> dict[str, Any]:
        return {"torch_npu": self.torch_npu_version, "op_plugin": self.release.describe(),
                "op_plugin_choice": self.release_note, "atb": {"loaded": self.atb.loaded, "detail": self.atb.detail},
                "ops": {op: p.to_dict() for op, p in self.ops.items()}, "signatures": dict(self.signatures)}


def choose_release(version: str | None) -> tuple[OpPluginRelease, str]:
    release = release_for_torch_npu(version)
    if release is not None:
        return release, f"torch_npu {version} ships op-plugin {release.branch}"
    pinned = load_release(PINNED_BRANCH)
    return pinned, (f"torch_npu {version} is not in hyspec's op-plugin data: the limits of the supported stack "
                    f"({pinned.describe()}) are assumed; signatures are still read from the installed ops")


def check_atb(fns: NpuFunctions, device: torch.device) -> AtbStatus:
    """One tiny ATB call (a 1-token KV write): its lazy wrapper loads libatb on first use or raises."""
    fn = fns.reshape_and_cache
    if fn is None:
        return AtbStatus(False, "torch_npu has no _npu_reshape_and_cache to test ATB with")
    try:
        key = torch.zeros(1, 1, 16, dtype=torch.float16, device=device)
        cache = torch.zeros(1, 16, 1, 16, dtype=torch.float16, device=device)
        fn(key, key.clone(), cache, cache.clone(), torch.zeros(1, dtype=torch.int32, device=device))
    except Exception as exc:  # OSError (libatb not found) or RuntimeError from ATB
        return AtbStatus(False, f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}; {ATB_HINT}")
    return AtbStatus(True, "_npu_reshape_and_cache ran on a 1-token cache at start-up")


def plan(torch_npu: ModuleType, device: torch.device | str | None = None) -> NpuPlan:
    device = torch.device(device) if device is not None else _default_device(torch_npu)
    found = find_functions(torch_npu)
    version = getattr(torch_npu, "__version__", None)
    release, note = choose_release(version)
    release_matched = release_for_torch_npu(version) is not None
    atb = check_atb(found, device)
    usable: dict[str, Callable] = {}
    why_not: dict[str, str] = {}
    signatures: dict[str, str] = {}
    for which, (attr, namespace) in FUNCTIONS.items():
        fn = getattr(found, which)
        if fn is None:
            why_not[which] = f"torch_npu has no {attr}"
            continue
        sig = signature_of(fn, namespace, attr)
        source = ""
        if sig is None and release_matched:
            # The live op exposes no schema (a C binding that is not in torch's registry): the signature of the
            # op-plugin release this torch_npu ships, read from its sources (op_plugin_data), stands in.
            sig, source = release.signature(attr), f"  [from op-plugin {release.branch} data: the live op has none]"
        if sig is None:
            why_not[which] = f"{found.name(which)}: its signature cannot be read, so hyspec's call cannot be checked"
            continue
        signatures[which] = sig.text + source
        absent = sig.missing(*KEYWORDS[which])
        if absent:
            why_not[which] = (f"{found.name(which)} takes no {', '.join(absent)} in this torch_npu "
                              f"({_short(sig)})")
            continue
        limits = release.limits(attr)
        if limits.get("documented") is False:
            why_not[which] = f"not documented in {release.describe()}: {limits.get('note', 'no doc page')}"
            continue
        if which in ATB_FIELDS and not atb.loaded:
            why_not[which] = "ATB not loaded: source /usr/local/Ascend/nnal/atb/set_env.sh (see atb)"
            continue
        if which == "scatter_pa_kv_cache":
            modes = release.limits("npu_scatter_pa_kv_cache").get("cache_modes")
            if modes is not None and "Norm" not in modes:
                why_not[which] = f"cache_mode 'Norm' is not documented in {release.describe()}"
                continue
        usable[which] = fn
    ops = _op_plans(found, usable, why_not, release)
    return NpuPlan(version, release, note, atb, usable, signatures, ops)


def _short(sig: Signature) -> str:
    return sig.text if len(sig.text) <= 160 else sig.text[:157] + "..."


def _op_plans(found: NpuFunctions, usable: dict[str, Callable], why_not: dict[str, str],
              release: OpPluginRelease) -> dict[str, OpPlan]:
    def variant(which: str, detail: str = "") -> str:
        return found.name(which) + (f" ({detail})" if detail else "")

    def reject(p: OpPlan, *fields: str) -> None:
        for which in fields:
            if which in why_not:
                p.rejected[variant(which) if getattr(found, which) else f"torch_npu.{FUNCTIONS[which][0]}"] = \
                    why_not[which]

    layouts = release.limits("npu_fused_infer_attention_score").get("paged_layouts", {})
    attention = OpPlan()
    if "fia" in usable:
        tnd = layouts.get("TND")
        bsnd = layouts.get("BSND", {})
        if tnd is None:
            causal = "causal steps: BSND + explicit causal mask (TND with PageAttention is not documented here)"
        else:
            dims = tnd.get("head_dims")
            causal = (f"causal steps: TND + sparse_mode 3 for head_dim {'/'.join(map(str, dims)) if dims else 'any'}, "
                      "else BSND + explicit causal mask")
        multiple = bsnd.get("multi_query_block_size_multiple")
        trees = "trees: BSND + explicit mask" + (f", block_size a multiple of {multiple} for more than one query "
                                                 "row" if multiple else "")
        attention.uses.append(variant("fia", f"{causal}; {trees}"))
        if "paged_attention" in usable:
            attention.uses.append(variant("paged_attention", "single-token decode"))
    elif "paged_attention" in usable:
        attention.uses.append(variant("paged_attention", "single-token decode only"))
    attention.uses.append(REFERENCE + (" (shapes outside the documented limits)" if attention.uses else ""))
    reject(attention, "fia", "paged_attention")

    write_kv = OpPlan()
    if "scatter_pa_kv_cache" in usable:
        write_kv.uses.append(variant("scatter_pa_kv_cache", "cache_mode='Norm'"))
    if "reshape_and_cache" in usable:
        write_kv.uses.append(variant("reshape_and_cache", "float16/bfloat16/int8 caches"))
    write_kv.uses.append(REFERENCE)
    reject(write_kv, "scatter_pa_kv_cache", "reshape_and_cache")

    rms = OpPlan()
    if "rms_norm" in usable:
        rms.uses.append(variant("rms_norm"))
    if "add_rms_norm" in usable:
        rms.uses.append(variant("add_rms_norm", "with residual"))
    rms.uses.append(REFERENCE)
    reject(rms, "rms_norm", "add_rms_norm")

    rotary = OpPlan()
    rope = release.limits("npu_apply_rotary_pos_emb")
    if "apply_rotary_pos_emb" in usable:
        dims = rope.get("head_dims", [64, 128])
        rotary.uses.append(variant("apply_rotary_pos_emb", f"rotary_mode='half', head_dim {'/'.join(map(str, dims))}"))
    if "rotary_mul" in usable:
        rotary.uses.append(variant("rotary_mul", "rotary_mode='half', q and k one call each"))
    if "rotary_embedding" in usable:
        rotary.uses.append(variant("rotary_embedding", "the first RoPE table of the process only"))
    rotary.uses.append(REFERENCE)
    reject(rotary, "apply_rotary_pos_emb", "rotary_mul", "rotary_embedding")
    return {"attention": attention, "write_kv": write_kv, "rms_norm": rms, "rotary": rotary}


def _default_device(torch_npu: ModuleType) -> torch.device:
    if getattr(torch_npu, "HYSPEC_EMULATION", None):
        return torch.device("cpu")  # the emulated NPU computes on the host
    return torch.device("npu", 0)


__all__ = ["ATB_HINT", "AtbStatus", "NpuPlan", "OpPlan", "check_atb", "choose_release", "plan"]
