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

hyspec's EAGLE-3 head runs ``fc`` over three fused target layers or, without ``fc``, the target's last hidden
state (:func:`reads_fused_layers`), and one or more decoder layers (:func:`check_layer_count`); the variants
it does not compute are refused by name (:func:`refuse_variants`), never loaded with a switch ignored.
"""
from __future__ import annotations

import logging
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

log = logging.getLogger(__name__)


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


def refuse_multi_layer_eagle1(layers: int) -> None:
    if layers > 1:
        raise CheckpointError(f"an EAGLE-1/2 head with {layers} decoder layers: hyspec runs multi-layer heads for "
                              "EAGLE-3 only (vLLM's llama_eagle3.py layout); not supported, refused rather than "
                              "drafted with layers dropped")


def check_layer_count(configured: int, stored: int) -> None:
    """An EAGLE-3 head's ``num_hidden_layers`` against the ``layers.N.*`` its tensors hold (``midlayer.*``
    alone is one layer).  vLLM builds the layers the config names and loads whatever tensors match, so a
    disagreement would run layers with missing weights or drop stored ones: refused."""
    stored = max(stored, 1)
    if configured != stored:
        raise CheckpointError(f"the EAGLE-3 head's config says num_hidden_layers {configured} but its tensors hold "
                              f"{stored} decoder layers (layers.0 .. layers.{stored - 1}); a corrupt or mixed "
                              "checkpoint")


def reads_fused_layers(body: dict[str, Any], names: Iterable[str]) -> bool:
    """Whether an EAGLE-3 head has ``fc`` over fused target layers (else it reads the target's last hidden state).

    vLLM 0.32 decides by ``eagle_config.use_aux_hidden_state`` alone (default true), dropping a stored ``fc``
    when it is false and leaving ``fc`` unloaded when the tensor is missing: the second is refused here.
    """
    eagle_cfg = body.get("eagle_config") or {}
    use_aux = eagle_cfg.get("use_aux_hidden_state", True)
    if not isinstance(use_aux, bool):
        raise CheckpointError(f"eagle_config.use_aux_hidden_state must be true or false, got {use_aux!r}")
    has_fc = "fc.weight" in set(names)
    if use_aux and not has_fc:
        raise CheckpointError("the EAGLE-3 head has no fc.weight but eagle_config.use_aux_hidden_state is not false: "
                              "a head that reads the target's last hidden state unfused must say "
                              "\"eagle_config\": {\"use_aux_hidden_state\": false} (vLLM would run an fc it never "
                              "loaded)")
    if not use_aux and has_fc:
        log.warning("the EAGLE-3 head sets eagle_config.use_aux_hidden_state false: its fc.weight is ignored and it "
                    "reads the target's last hidden state (as vLLM's llama_eagle3.py does)")
    return use_aux


def refuse_variants(body: dict[str, Any], names: Iterable[str]) -> None:
    """Refuse, naming the key or tensor, an EAGLE-3 head variant hyspec's head would run wrong."""
    eagle_cfg = body.get("eagle_config") or {}
    names = set(names)
    for key, off in _UNCOMPUTED_SWITCHES.items():
        value = eagle_cfg.get(key, body.get(key, off))
        if value is not None and value != off:
            raise CheckpointError(f"the EAGLE-3 head sets {key}: {value!r}, a variant hyspec's head does not compute "
                                  "(vLLM's llama_eagle3.py does); refused rather than drafted without it")
    if "input_norm.weight" in names:
        raise CheckpointError("the EAGLE-3 head carries input_norm.weight (norm_before_fc), a norm before fc that "
                              "hyspec's head does not compute; not supported")
