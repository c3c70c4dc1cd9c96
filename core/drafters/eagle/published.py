"""EAGLE-3 heads as other trainers publish them, read into the flat config :mod:`.checkpoint` loads.

Layouts read here (upstream sources, read for their config keys and tensor names):

* **speculators** (vllm-project/speculators, ``src/speculators/models/eagle3/config.py`` @ 11ecdd3,
  ``core.py`` @ 033c87f, ``model_definitions.py`` @ 08af5f4; vLLM 0.32's reading of it,
  ``vllm/transformers_utils/configs/speculators/algos.py``): ``config.json`` holds
  ``speculators_model_type: "eagle3"``, the decoder layer's own Llama / Qwen3 config under
  ``transformer_layer_config``, and beside it ``draft_vocab_size``, ``target_hidden_size``,
  ``norm_before_residual``, ``eagle_aux_hidden_state_layer_ids`` (vLLM's numbering, passed through as is).
  Tensors: ``fc.weight``, ``layers.0.*`` (the first layer, with ``hidden_norm``), ``norm.weight``,
  ``lm_head.weight``, ``d2t``, ``t2d`` and a copy of the verifier's ``embed_tokens.weight``.
* **vLLM** (``vllm/model_executor/models/llama_eagle3.py`` in vLLM 0.32): the SafeAILab layout
  (``midlayer.*``) or its own ``layers.N.*``; switches ``eagle_config.use_aux_hidden_state`` (False: no
  ``fc``), ``norm_before_fc`` (an ``input_norm`` before ``fc``), ``fc_norm`` (one norm per fused layer),
  ``norm_output``, ``logit_scale``, and ``num_hidden_layers > 1`` (later layers read the hidden state only).

hyspec's EAGLE-3 head is one decoder layer behind ``fc`` over three fused target layers; the variants it
does not compute are refused by name (:func:`refuse_variants`), never loaded with a switch ignored.
"""
from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from hyspec.errors import CheckpointError

SPECULATORS_TYPE_KEY = "speculators_model_type"
SPECULATORS_LAYER_KEY = "transformer_layer_config"
#: the speculators config keys beside ``transformer_layer_config`` that shape an EAGLE-3 head
_SPECULATORS_EAGLE3_KEYS = ("draft_vocab_size", "target_hidden_size", "norm_before_residual",
                            "eagle_aux_hidden_state_layer_ids", "norm_before_fc", "fc_norm", "norm_output")
#: EAGLE-3 switches vLLM's llama_eagle3.py honours and hyspec's head does not compute: key -> the "off" value
_UNCOMPUTED_SWITCHES = {"norm_before_fc": False, "fc_norm": False, "norm_output": False, "logit_scale": 1.0}
_LAYER_INDEX = re.compile(r"^layers\.(\d+)\.")


def speculators_eagle3_body(raw: dict[str, Any]) -> dict[str, Any] | None:
    """The flat head config of a speculators ``config.json`` (None when ``raw`` is not one).

    Only ``eagle3`` is read: the other speculators types (dflash, dflash2, peagle, dspark, mtp, ...) are
    other drafters, refused by name.
    """
    kind = raw.get(SPECULATORS_TYPE_KEY)
    if kind is None:
        return None
    if kind != "eagle3":
        raise CheckpointError(f"a speculators {kind!r} checkpoint ({SPECULATORS_TYPE_KEY}: {kind!r}): hyspec reads "
                              "speculators' eagle3 heads only, as method 'eagle3'")
    layer = raw.get(SPECULATORS_LAYER_KEY)
    if not isinstance(layer, dict):
        raise CheckpointError(f"a speculators eagle3 config needs {SPECULATORS_LAYER_KEY!r} (the decoder layer's "
                              f"config) as an object, got {type(layer).__name__}")
    if "norm_before_residual" not in raw:
        # speculators' default is False, vLLM's reading of a missing key is True: the file must say which.
        raise CheckpointError("the speculators eagle3 config has no 'norm_before_residual': speculators defaults it "
                              "to false and vLLM reads it as true; add the value the head was trained with")
    body = dict(layer)
    body.update({key: raw[key] for key in _SPECULATORS_EAGLE3_KEYS if raw.get(key) is not None})
    return body


def decoder_layer_count(names: Iterable[str]) -> int:
    """How many ``layers.N.*`` decoder layers the tensors hold (0 for SafeAILab's ``midlayer.*``)."""
    found = {int(m.group(1)) for m in map(_LAYER_INDEX.match, names) if m}
    return max(found) + 1 if found else 0


def refuse_multi_layer(layers: int) -> None:
    if layers > 1:
        raise CheckpointError(f"an EAGLE head with {layers} decoder layers: hyspec's EAGLE heads run one layer "
                              "(vLLM's llama_eagle3.py runs the later ones on the hidden state alone); "
                              "not supported, refused rather than drafted with layers dropped")


def refuse_variants(body: dict[str, Any], names: Iterable[str]) -> None:
    """Refuse, naming the key or tensor, an EAGLE-3 head variant hyspec's head would run wrong."""
    eagle_cfg = body.get("eagle_config") or {}
    names = set(names)
    if eagle_cfg.get("use_aux_hidden_state", True) is False or "fc.weight" not in names:
        why = ("eagle_config.use_aux_hidden_state is false" if "fc.weight" in names or eagle_cfg.get(
            "use_aux_hidden_state", True) is False else "the checkpoint has no fc.weight")
        raise CheckpointError(f"an EAGLE-3 head without fc ({why}): it reads the target's last hidden state "
                              "unfused, which hyspec's EAGLE-3 head (fc over three target layers) does not run; "
                              "not supported")
    for key, off in _UNCOMPUTED_SWITCHES.items():
        value = eagle_cfg.get(key, body.get(key, off))
        if value is not None and value != off:
            raise CheckpointError(f"the EAGLE-3 head sets {key}: {value!r}, a variant hyspec's head does not compute "
                                  "(vLLM's llama_eagle3.py does); refused rather than drafted without it")
    if "input_norm.weight" in names:
        raise CheckpointError("the EAGLE-3 head carries input_norm.weight (norm_before_fc), a norm before fc that "
                              "hyspec's head does not compute; not supported")
