"""Mixture-of-experts GGUFs as llama.cpp writes them: Mixtral, Qwen2-MoE and Qwen3-MoE.

What llama.cpp's converter writes (``convert_hf_to_gguf.py``, ggml-org/llama.cpp
a458664fc83b6513baea7adafcb0ef0626b006f8: ``TextModel.set_gguf_parameters``, ``LlamaModel.modify_tensors``,
``Qwen2MoeModel``, ``Qwen3MoeModel``):

* Mixtral is architecture ``llama`` with ``llama.expert_count`` (``num_local_experts``) and
  ``llama.expert_used_count`` (``num_experts_per_tok``); the experts are ``feed_forward_length`` wide.
  Qwen2-MoE / Qwen3-MoE are ``qwen2moe`` / ``qwen3moe``, with ``expert_feed_forward_length``
  (``moe_intermediate_size``) and, Qwen2-MoE, ``expert_shared_feed_forward_length``; their
  ``feed_forward_length`` is the dense MLP's ``intermediate_size``.
* Per layer, the router ``blk.N.ffn_gate_inp`` (always F32: the converter never quantizes it) and the
  experts stacked into one 3-d tensor each, ``ffn_gate_exps`` / ``ffn_up_exps`` ``[E, I, H]`` and
  ``ffn_down_exps`` ``[E, H, I]`` (Hugging Face order: Mixtral's ``w1`` / ``w3`` / ``w2``, Qwen's
  ``gate_proj`` / ``up_proj`` / ``down_proj``); Qwen2-MoE's shared expert as ``ffn_{gate,up,down}_shexp``
  and its gate ``ffn_gate_inp_shexp`` (``[1, H]``, or ``[H]``, which llama.cpp also accepts).
* ``norm_topk_prob`` is not written for any of the three.  llama.cpp fixes it per architecture in its
  graph (``build_moe_ffn``'s ``norm_w``, src/models/llama.cpp, qwen2moe.cpp, qwen3moe.cpp): renormalised
  for Mixtral and Qwen3-MoE, not for Qwen2-MoE.  hyspec reads the file as llama.cpp does; a file saying
  otherwise (``{arch}.expert_weights_norm``) is refused, since llama.cpp would not follow it.
  A Qwen3-MoE source with ``norm_topk_prob: false`` (or a Qwen2-MoE with ``true``) therefore does not
  survive the conversion; nothing in the file can tell.
* ``decoder_sparse_step`` / ``mlp_only_layers`` are not written either; llama.cpp's qwen2moe / qwen3moe need
  a router on every layer.  hyspec reads a layer without ``ffn_gate_inp`` as a dense MLP (what the converter
  writes for such a layer), so those files load here too.

The stacked tensors are exposed per expert (:class:`ExpertSlice`, a view of the file's blocks, nothing
copied) under the Hugging Face names hyspec.model.moe.moe_layer_state reads, so safetensors and GGUF share
one loader; where the backend computes with the blocks, hyspec.model.moe_stored keeps each expert's slice as
stored instead of dequantizing it.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from hyspec.errors import CheckpointError

#: GGUF architecture -> the Hugging Face model_type of its MoE model (``llama`` only with ``expert_count``)
MOE_GGUF_MODEL_TYPES = {"llama": "mixtral", "qwen2moe": "qwen2_moe", "qwen3moe": "qwen3_moe"}
#: llama.cpp's fixed choice per architecture: renormalise the top-k probabilities (build_moe_ffn's norm_w)
_RENORMALISED = {"llama": True, "qwen2moe": False, "qwen3moe": True}
_SOFTMAX_GATING = 1  # gguf.ExpertGatingFuncType.SOFTMAX
#: every per-layer tensor of a routed block: experts (``*_exps``), shared expert (``*_shexp``), router (``gate_inp``),
#: and those hyspec does not read (``ffn_exp_probs_b``, ``ffn_gate_up_exps``, ...), which are refused
_MOE_LAYER_RE = re.compile(r"^blk\.(\d+)\.(ffn_[a-z_]*(?:exp|gate_inp)[a-z_]*)\.(weight|bias|scale)$")


@dataclass(frozen=True)
class ExpertSlice:
    """One expert's matrix inside a stacked ``ffn_*_exps`` tensor (or a reshaped one-row tensor), with the
    fields of ``gguf.ReaderTensor`` that hyspec.model.gguf_checkpoint reads."""

    name: str  # the stacked tensor's GGUF name and the expert, for error messages
    tensor_type: Any  # gguf.GGMLQuantizationType
    shape: tuple[int, ...]  # GGUF ne order (columns first)
    data: np.ndarray  # [rows, bytes per row] blocks for quantized types, else [rows, cols] values


def is_moe_gguf(arch: str, metadata: dict[str, Any]) -> bool:
    """The file holds a mixture-of-experts model of an architecture hyspec runs."""
    return arch in MOE_GGUF_MODEL_TYPES and bool(metadata.get(f"{arch}.expert_count") or 0)


def moe_tensors(tensors, arch: str, experts: int, file_name: str) -> dict[str, Any]:
    """Hugging Face name -> tensor (a reader tensor or an :class:`ExpertSlice`) for every routed block.

    ``tensors`` are the file's ``gguf.ReaderTensor`` objects.  An expert tensor hyspec does not read
    (fused ``ffn_gate_up_exps``, per-expert scales, router biases, ...) is refused: dropping it would
    load the model wrong."""
    mixtral = arch == "llama"
    block = "block_sparse_moe." if mixtral else "mlp."
    stacked = {"ffn_gate_exps": "w1" if mixtral else "gate_proj", "ffn_up_exps": "w3" if mixtral else "up_proj",
               "ffn_down_exps": "w2" if mixtral else "down_proj"}
    shared = {} if mixtral else {"ffn_gate_shexp": "shared_expert.gate_proj", "ffn_up_shexp": "shared_expert.up_proj",
                                 "ffn_down_shexp": "shared_expert.down_proj"}
    out: dict[str, Any] = {}
    for t in tensors:
        m = _MOE_LAYER_RE.match(t.name)
        if m is None:
            continue
        layer, part, kind = m.groups()
        prefix = f"model.layers.{layer}.{block}"
        if kind != "weight":
            part = f"{part}.{kind}"
        if part == "ffn_gate_inp":
            out[prefix + "gate.weight"] = t
        elif part in stacked:
            if len(t.shape) != 3 or int(t.shape[2]) != experts:
                raise CheckpointError(f"{file_name}: {t.name} has GGUF shape {[int(d) for d in t.shape]}, but "
                                      f"{arch}.expert_count says {experts} experts stacked on its last axis")
            ne = (int(t.shape[0]), int(t.shape[1]))
            for e in range(experts):
                out[f"{prefix}experts.{e}.{stacked[part]}.weight"] = ExpertSlice(f"{t.name}[{e}]", t.tensor_type,
                                                                                ne, t.data[e])
        elif part in shared:
            out[f"{prefix}{shared[part]}.weight"] = t
        elif part == "ffn_gate_inp_shexp" and not mixtral:
            # HF's shared_expert_gate is a [1, H] linear; llama.cpp accepts it stored as [H] too
            cols = int(t.shape[0])
            out[prefix + "shared_expert_gate.weight"] = ExpertSlice(t.name, t.tensor_type, (cols, 1),
                                                                    np.asarray(t.data).reshape(1, -1))
        else:
            raise CheckpointError(f"{file_name}: GGUF tensor {t.name} ({arch} mixture of experts) is not supported: "
                                  "hyspec reads ffn_gate_inp, ffn_gate_exps / ffn_up_exps / ffn_down_exps"
                                  + ("" if mixtral else " and the shared expert's ffn_*_shexp / ffn_gate_inp_shexp"))
    return out


def moe_hf_config(cfg: dict[str, Any], metadata: dict[str, Any], arch: str, routed_layers: set[int],
                  has_qkv_bias: bool, file_name: str) -> None:
    """Turn the dense ``config.json``-shaped ``cfg`` into the MoE model's, in place, from the file's metadata
    and which layers hold a router (``routed_layers``)."""
    def key(name: str, default: Any = None) -> Any:
        return metadata.get(f"{arch}.{name}", default)

    def refuse(what: str, why: str) -> CheckpointError:
        return CheckpointError(f"{file_name}: {what} is not supported in a {arch} mixture-of-experts GGUF ({why})")

    experts, used = int(key("expert_count")), int(key("expert_used_count", 0) or 0)
    if used <= 0:
        raise CheckpointError(f"{file_name}: GGUF metadata lacks {arch}.expert_used_count (experts per token)")
    gating = key("expert_gating_func")
    if gating not in (None, _SOFTMAX_GATING):
        raise refuse(f"{arch}.expert_gating_func {gating}", "hyspec routes by softmax, 1")
    scale = key("expert_weights_scale")
    if scale not in (None, 0.0, 1.0):  # llama.cpp: 0 means unscaled
        raise refuse(f"{arch}.expert_weights_scale {scale}", "routing weights are not scaled")
    if (key("expert_group_count") or 1) > 1:
        raise refuse(f"{arch}.expert_group_count {key('expert_group_count')}", "grouped routing is not implemented")
    if (key("expert_shared_count") or 1) > 1:
        raise refuse(f"{arch}.expert_shared_count {key('expert_shared_count')}", "one shared expert at most")
    renormalise = _RENORMALISED[arch]
    stated = key("expert_weights_norm")
    if stated is not None and bool(stated) != renormalise:
        raise refuse(f"{arch}.expert_weights_norm {bool(stated)}",
                     f"llama.cpp renormalises {arch}'s top-k probabilities {'always' if renormalise else 'never'} "
                     "and ignores that key, so what the file means is ambiguous")
    layers = cfg["num_hidden_layers"]
    dense = [i for i in range(layers) if i not in routed_layers]
    cfg["model_type"] = MOE_GGUF_MODEL_TYPES[arch]
    cfg["num_experts_per_tok"] = used
    if arch == "llama":
        if dense:
            raise refuse(f"layers {dense[:4]} without a router (ffn_gate_inp)", "Mixtral routes every layer")
        cfg["num_local_experts"] = experts
        if key("expert_feed_forward_length") not in (None, cfg["intermediate_size"]):
            raise refuse(f"{arch}.expert_feed_forward_length {key('expert_feed_forward_length')} != "
                         f"feed_forward_length {cfg['intermediate_size']}", "Mixtral's experts are the MLP's width")
        return
    if cfg.get("use_sliding_window"):
        raise refuse(f"{arch}.attention.sliding_window", "the Qwen MoE window placement is not implemented")
    # llama.cpp's fallbacks when the widths are absent (src/models/qwen2moe.cpp, qwen3moe.cpp)
    cfg["num_experts"] = experts
    cfg["moe_intermediate_size"] = int(key("expert_feed_forward_length") or cfg["intermediate_size"] // used)
    cfg["norm_topk_prob"] = renormalise
    cfg["decoder_sparse_step"] = 1
    cfg["mlp_only_layers"] = dense
    if arch == "qwen2moe":
        cfg["shared_expert_intermediate_size"] = int(key("expert_shared_feed_forward_length")
                                                     or cfg["intermediate_size"])
        cfg["qkv_bias"] = has_qkv_bias


__all__ = ["ExpertSlice", "MOE_GGUF_MODEL_TYPES", "is_moe_gguf", "moe_hf_config", "moe_tensors"]
