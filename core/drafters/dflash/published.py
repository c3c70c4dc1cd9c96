"""DFlash drafters as z-lab publishes them (``z-lab/*-DFlash`` on the Hugging Face Hub), read as hyspec's DFlash.

Upstream: z-lab/dflash @ 1012959, ``dflash/model.py`` (``DFlashDraftModel``, ``dflash_generate``), and
vLLM 0.32's ``vllm/model_executor/models/qwen3_dflash.py``.  ``config.json`` is a Qwen3 config of the draft
layers plus::

    "architectures": ["DFlashDraftModel"], "block_size": 16,
    "dflash_config": {"mask_token_id": ID, "target_layer_ids": [1, 9, 17, ...]}

Tensors: ``fc.weight`` [H, len(ids) * H], ``hidden_norm.weight``, ``norm.weight`` and Qwen3 layers
``layers.{i}.self_attn.{q,k,v,o}_proj.weight`` (+ ``q_norm`` / ``k_norm``), ``layers.{i}.mlp.*``,
``layers.{i}.{input,post_attention}_layernorm.weight``.  There is no mask tensor: a mask slot embeds
``mask_token_id`` with the target's embedding.

The maths is hyspec's DFlash (:mod:`hyspec.drafters.dflash.model`): the block is ``[root, MASK x (block_size
- 1)]`` (so hyspec's ``block_size``, the mask slots, is one less), context = ``hidden_norm(fc(.))`` over the
target's hidden states ``hidden_states[id + 1]`` (the output of target layer ``id``, hyspec's numbering),
keys and values of context and block through each layer's k/v projections, non-causal, full attention, and
the target's lm_head after ``norm``.  Variants that change this maths are refused by name: DFlash2 (grouped
convolutions, candidate selector), sliding or causal draft layers, logit multipliers / soft-capping, a
scaled input embedding, and the speculators ``dflash`` layout (another key set).
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from hyspec.drafters.dflash.model import DFlashConfig
from hyspec.errors import CheckpointError
from hyspec.model.config import ModelConfig

ZLAB_KEY = "dflash_config"
LAYOUT_KEY = "published_layout"  # in the section read_drafter_config returns: "z-lab" for these checkpoints
ZLAB = "z-lab"
#: config keys (top level or in dflash_config) whose non-default values change DFlash's maths: key -> default
_UNCOMPUTED = {"output_multiplier": 1.0, "final_logit_softcapping": None, "input_embedding_scale": 1.0,
               "is_causal": False, "causal": False, "use_swa": False, "conv_kernel_size": None,
               "conv_group_size": None, "selector_rank": None, "selector_top_k": None,
               "add_swa_attention_sink_bias": None, "attention_value_scale": None}
_DFLASH2_MARKERS = ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")


def is_zlab(data: dict[str, Any]) -> bool:
    return isinstance(data.get(ZLAB_KEY), dict)


def _value(data: dict[str, Any], key: str, default: Any = None) -> Any:
    return data[ZLAB_KEY].get(key, data.get(key, default))


def zlab_config(data: dict[str, Any], file: Path, target: ModelConfig | None = None) -> tuple[DFlashConfig, dict]:
    """``(config, section)`` of a z-lab DFlash ``config.json``; variants hyspec does not compute are refused."""
    architectures = data.get("architectures") or []
    if "DFlash2DraftModel" in architectures or any(_value(data, k) is not None for k in _DFLASH2_MARKERS):
        raise CheckpointError(f"{file} is a DFlash2 drafter (DFlash2DraftModel: grouped convolutions and a candidate "
                              "selector); hyspec runs DFlash (DFlashDraftModel) only")
    if architectures and architectures != ["DFlashDraftModel"]:
        raise CheckpointError(f"{file} names architectures {architectures}; hyspec reads z-lab's DFlashDraftModel only")
    for key, default in _UNCOMPUTED.items():
        value = _value(data, key, default)
        if value is not None and value != default and not (default is None and not value):
            raise CheckpointError(f"{file} sets {key}: {value!r}, a DFlash variant hyspec does not compute; "
                                  "refused rather than drafted without it")
    layer_types = data.get("layer_types") or []
    if any(t != "full_attention" for t in layer_types):
        raise CheckpointError(f"{file} has draft layer_types {layer_types}: sliding-window DFlash layers are not "
                              "supported (hyspec's DFlash layers attend in full)")
    try:
        ids = tuple(int(i) for i in _value(data, "target_layer_ids"))
        mask_id = int(_value(data, "mask_token_id"))
        block = int(_value(data, "block_size", 16))
    except (TypeError, ValueError):
        raise CheckpointError(f"{file}: dflash_config needs target_layer_ids (a list of layer numbers) and "
                              f"mask_token_id (a token id); got {data[ZLAB_KEY]!r}") from None
    if block < 2:
        raise CheckpointError(f"{file}: block_size {block} leaves no mask slot (the root takes one)")
    if target is not None and target.num_hidden_layers - 1 in ids:
        # HF's hidden_states[L] is after the final norm, hyspec's context rows are residual streams.
        raise CheckpointError(f"{file}: target_layer_ids {list(ids)} reads the target's last layer, whose upstream "
                              "feature is the final-normed state; not supported")
    if target is not None and not 0 <= mask_id < target.vocab_size:
        raise CheckpointError(f"{file}: mask_token_id {mask_id} is outside the target's vocabulary "
                              f"({target.vocab_size}): the drafter was trained for another target")
    try:
        layers = ModelConfig.from_dict({k: v for k, v in data.items() if k != ZLAB_KEY})
        config = DFlashConfig(layers=layers, target_layers=ids, block_size=block - 1)
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"{file}: bad DFlash layer config ({exc!r})") from None
    return config, {"method": "dflash", "target_layers": list(ids), "block_size": block - 1,
                    "mask_token_id": mask_id, LAYOUT_KEY: ZLAB}


def zlab_state(names: list[str], get: Callable[[str], torch.Tensor], expected: dict[str, torch.Tensor],
               mask_embedding: torch.Tensor) -> dict[str, torch.Tensor]:
    """hyspec's DFlash state (fused ``qkv_proj`` / ``gate_up_proj``, ``mask_embedding``) from z-lab's tensors."""
    available = set(names)
    used: set[str] = set()

    def take(name: str) -> torch.Tensor:
        if name not in available:
            raise CheckpointError(f"the z-lab DFlash checkpoint lacks tensor {name!r}")
        used.add(name)
        return get(name)

    state: dict[str, torch.Tensor] = {}
    for name in expected:
        if name == "mask_embedding":
            state[name] = mask_embedding
        elif ".qkv_proj." in name:
            stem, kind = name.split(".qkv_proj.")
            state[name] = torch.cat([take(f"{stem}.{p}_proj.{kind}") for p in "qkv"])
        elif ".gate_up_proj." in name:
            stem, kind = name.split(".gate_up_proj.")
            state[name] = torch.cat([take(f"{stem}.gate_proj.{kind}"), take(f"{stem}.up_proj.{kind}")])
        else:
            state[name] = take(name)
    unknown = sorted(available - used)
    if unknown:
        raise CheckpointError(f"the z-lab DFlash checkpoint has tensors hyspec's DFlash does not use: {unknown[:4]}")
    return state
