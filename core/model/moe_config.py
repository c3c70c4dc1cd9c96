"""What a mixture-of-experts ``config.json`` says about its routed MLPs (Mixtral, Qwen2-MoE, Qwen3-MoE).

Read the way transformers' ``configuration_mixtral.py`` / ``configuration_qwen2_moe.py`` /
``configuration_qwen3_moe.py`` (and the ``*DecoderLayer`` constructors) read it:

* Mixtral: every layer routed, top-``num_experts_per_tok`` of ``num_local_experts`` experts of width
  ``intermediate_size``, the chosen probabilities always renormalised.
* Qwen2-MoE / Qwen3-MoE: layer ``i`` is routed unless it is in ``mlp_only_layers`` or
  ``(i + 1) % decoder_sparse_step != 0`` (a routed-free layer is a dense MLP of ``intermediate_size``);
  experts are ``moe_intermediate_size`` wide; ``norm_topk_prob`` renormalises.  Qwen2-MoE adds a shared
  expert (``shared_expert_intermediate_size``) scaled by ``sigmoid(shared_expert_gate(x))``.

Kept apart from hyspec.model.moe (the modules) so that hyspec.model.config needs no torch module code.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hyspec.errors import CheckpointError

MOE_MODEL_TYPES = ("mixtral", "qwen2_moe", "qwen3_moe")


@dataclass(frozen=True)
class MoEConfig:
    num_experts: int
    top_k: int  # experts each token is routed to
    expert_intermediate_size: int
    norm_topk_prob: bool  # renormalise the chosen experts' probabilities to sum to 1
    #: Qwen2-MoE's always-on expert (0: none) and its sigmoid gate
    shared_expert_intermediate_size: int = 0
    #: per layer: a routed block (True) or the dense MLP of ``intermediate_size`` (False)
    sparse_layers: tuple[bool, ...] = ()
    #: Mixtral multiplies the experts' outputs by the fp32 routing weights; Qwen casts them to the activation dtype
    fp32_routing_weights: bool = False

    def is_sparse(self, layer: int) -> bool:
        if not 0 <= layer < len(self.sparse_layers):  # e.g. an MTP layer stored past the decoder layers
            raise CheckpointError(f"layer {layer} lies outside the {len(self.sparse_layers)} decoder layers this MoE "
                                  "config describes; extra (MTP) layers of a MoE checkpoint are not supported")
        return self.sparse_layers[layer]


def moe_config_from_dict(d: dict[str, Any], model_type: str, num_layers: int) -> MoEConfig | None:
    """The routed-MLP description of a MoE ``config.json`` (None for a dense model type)."""
    if model_type not in MOE_MODEL_TYPES:
        return None
    act = d.get("hidden_act", "silu")
    if act != "silu":
        raise CheckpointError(f"config.json: {model_type} hidden_act {act!r} is not supported (only 'silu')")
    if model_type == "mixtral":
        experts, width = _positive(d, "num_local_experts", 8), _positive(d, "intermediate_size")
        sparse = (True,) * num_layers
        norm, shared = True, 0
    else:
        # transformers 5 writes Qwen3-MoE's count as num_local_experts (an attribute_map alias); the published
        # configs say num_experts
        key = "num_experts" if "num_experts" in d or "num_local_experts" not in d else "num_local_experts"
        experts, width = _positive(d, key, 60 if model_type == "qwen2_moe" else 128), _positive(d, "moe_intermediate_size")
        step = _positive(d, "decoder_sparse_step", 1)
        dense_only = set(d.get("mlp_only_layers") or ())
        sparse = tuple(i not in dense_only and (i + 1) % step == 0 for i in range(num_layers))
        norm = bool(d.get("norm_topk_prob", False))
        shared = _positive(d, "shared_expert_intermediate_size", 5632) if model_type == "qwen2_moe" else 0
    top_k = _positive(d, "num_experts_per_tok", 2 if model_type == "mixtral" else 4 if model_type == "qwen2_moe" else 8)
    if top_k > experts:
        raise CheckpointError(f"config.json: num_experts_per_tok ({top_k}) exceeds the number of experts ({experts})")
    return MoEConfig(num_experts=experts, top_k=top_k, expert_intermediate_size=width, norm_topk_prob=norm,
                     shared_expert_intermediate_size=shared, sparse_layers=sparse,
                     fp32_routing_weights=model_type == "mixtral")


def _positive(d: dict[str, Any], key: str, default: int | None = None) -> int:
    value = d.get(key, default)
    if value is None:
        raise CheckpointError(f"config.json is missing required key {key!r}")
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise CheckpointError(f"config.json: {key} must be a positive integer, got {value!r}")
    return value
