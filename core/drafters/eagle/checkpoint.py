"""Reading and writing EAGLE heads in the public layouts (SafeAILab EAGLE, vLLM, SGLang).

EAGLE-1/2 (``LlamaForCausalLMEagle``; SafeAILab writes ``LlamaForCausalLM``)::

    fc.weight [H, 2H]  (+ fc.bias [H])            over [token embedding ; feature]
    layers.0.self_attn.{q,k,v,o}_proj.weight      (+ biases with attention_bias)
    layers.0.mlp.{gate,up,down}_proj.weight
    layers.0.post_attention_layernorm.weight      (layers.0.input_layernorm.weight: usually absent)

EAGLE-3 (``LlamaForCausalLMEagle3``)::

    fc.weight [H, 3 * target_hidden_size]
    midlayer.self_attn.{q,k,v}_proj.weight [*, 2H], o_proj [H, H]
    midlayer.mlp.*, midlayer.{hidden_norm,input_layernorm,post_attention_layernorm}.weight
    norm.weight [H], lm_head.weight [draft_vocab_size, H]
    d2t [draft_vocab_size] int64 (target id = draft id + d2t), t2d [vocab_size] bool

``config.json`` is a Llama config with ``num_hidden_layers: 1``, the target's
``vocab_size`` and, for EAGLE-3, ``draft_vocab_size`` and optionally
``target_hidden_size``, ``eagle_aux_hidden_state_layer_ids`` (top level or in
``eagle_config``) and ``norm_before_residual``.  A ``model.`` prefix on every
tensor (vLLM-converted heads) is accepted.  An EAGLE-3 file's ``embed_tokens`` is
the head's own when it differs from the target's (or the hidden sizes differ);
otherwise the target's is shared.  The speculators layout (``layers.0.*``,
``transformer_layer_config``) and the EAGLE-3 variants refused by name are in
:mod:`hyspec.drafters.eagle.published`.

EAGLE-3 heads as vLLM's ``llama_eagle3.py`` also runs them are read (not written):
``num_hidden_layers: N > 1`` with ``layers.1.* .. layers.{N-1}.*`` (q/k/v ``[*, H]``,
``input_layernorm``, ``post_attention_layernorm``, mlp; a ``hidden_norm`` there is
unused, as in vLLM), and heads without ``fc`` (``eagle_config.use_aux_hidden_state:
false``) that read the target's last hidden state.
"""
from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any

import torch

from hyspec.drafters.checkpoint_io import StoredTensors, read_config_json, save_checkpoint, stored_tensors
from hyspec.drafters.eagle import published
from hyspec.drafters.eagle.model import (EAGLE, EAGLE3, Eagle3Head, EagleConfig, EagleHeadBase, build_head,
                                   default_aux_layer_ids)
from hyspec.errors import CheckpointError
from hyspec.model.config import ModelConfig
from hyspec.model.llama import CausalLM
from hyspec.model.rope import cos_sin_cache
from hyspec.model.weights import SafetensorsCheckpoint, check_shape
from hyspec.ops import OpTable

log = logging.getLogger(__name__)

ARCHITECTURES = {EAGLE: "LlamaForCausalLMEagle", EAGLE3: "LlamaForCausalLMEagle3"}
_LAYER_PREFIX = {EAGLE: "layers.0.", EAGLE3: "midlayer."}


def read_config(path: Path) -> dict[str, Any]:
    return read_config_json(path, "EAGLE head")


class _Names:
    """Tensor names of a head checkpoint with an optional ``model.`` prefix stripped, and an EAGLE-3 layer
    stored as ``layers.0.*`` (vLLM, speculators) read under SafeAILab's ``midlayer.*``."""

    def __init__(self, ckpt: "SafetensorsCheckpoint | StoredTensors"):
        self.ckpt = ckpt
        names = ckpt.names()
        prefix = "model." if names and all(n.startswith("model.") or n == "lm_head.weight" for n in names) else ""
        stored = {n[len(prefix):] if n.startswith(prefix) else n: n for n in names}
        self.layer_count = published.decoder_layer_count(stored)
        if "layers.0.hidden_norm.weight" in stored:  # hidden_norm: only EAGLE-3's first layer has one
            stored = {"midlayer." + n[len("layers.0."):] if n.startswith("layers.0.") else n: full
                      for n, full in stored.items()}
        self.stored = stored
        self.names = set(stored)

    def __contains__(self, name: str) -> bool:
        return name in self.stored

    def _stored(self, name: str) -> str:
        if name not in self.stored:
            raise CheckpointError(f"tensor {name!r} is missing from the EAGLE head checkpoint")
        return self.stored[name]

    def get(self, name: str, shape) -> torch.Tensor:
        return check_shape(name, self.ckpt.get(self._stored(name)), shape)

    def shape(self, name: str) -> tuple[int, ...]:
        return self.ckpt.shape(self._stored(name))


def detect_layout(names: _Names) -> str:
    if any(n.startswith("midlayer.") for n in names.names):
        return EAGLE3
    if any(n.startswith("layers.0.") for n in names.names):
        published.refuse_multi_layer_eagle1(names.layer_count)
        return EAGLE
    raise CheckpointError("the checkpoint holds neither an EAGLE layer (layers.0.*) nor an EAGLE-3 layer "
                          f"(midlayer.*); tensors: {sorted(names.names)[:6]}")


def eagle_config(raw: dict[str, Any], names: _Names, method: str, target_cfg: ModelConfig) -> EagleConfig:
    """Validate a head's config against its tensors and the target it is loaded for."""
    layout = detect_layout(names)
    if layout != method:
        other = ("an EAGLE-3 head (midlayer.*, or layers.0.* with hidden_norm)" if layout == EAGLE3 else "an EAGLE-1/2 head (layers.0.*)")
        raise CheckpointError(f"the drafter is {other}, but method {method!r} was requested; use method {layout!r}")
    body = published.speculators_eagle3_body(raw)
    if body is None:
        body = dict(raw.get("model") or raw) if raw.get("model_type") == "eagle" else dict(raw)
    body.setdefault("model_type", "llama")
    body.setdefault("hidden_act", "silu")
    try:
        layers = int(body.get("num_hidden_layers", 1))
        # Read with every layer, so a sliding window on any of them is seen; the head's layers share one shape.
        windows = ModelConfig.from_dict({**body, "num_hidden_layers": max(layers, 1),
                                         "tie_word_embeddings": False}).layer_windows
        layer = ModelConfig.from_dict({**body, "num_hidden_layers": 1, "tie_word_embeddings": False})
    except KeyError as exc:
        raise CheckpointError(f"the head's config.json is missing required key {exc.args[0]!r}") from None
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f"the head's config.json has a malformed value: {exc}") from None
    if method == EAGLE:
        published.refuse_multi_layer_eagle1(layers)
    else:
        published.check_layer_count(layers, names.layer_count)
    if any(w is not None for w in windows):
        raise CheckpointError(f"the EAGLE head's config gives its layers sliding-window attention ({list(windows)}); "
                              "hyspec's EAGLE heads attend over the whole context: not supported")
    H, V = target_cfg.hidden_size, target_cfg.vocab_size
    target_hidden = int(body.get("target_hidden_size") or layer.hidden_size)
    if layer.vocab_size != V:
        raise CheckpointError(f"the EAGLE head was trained for a target with vocab_size {layer.vocab_size}; "
                              f"this target has {V}")
    if target_hidden != H:
        raise CheckpointError(f"the EAGLE head was trained for a target with hidden size {target_hidden}; "
                              f"this target has {H}")
    use_fc = True
    if method == EAGLE3:
        published.refuse_variants(body, names.names)
        use_fc = published.reads_fused_layers(body, names.names)
    fc_in = (3 if method == EAGLE3 else 2) * (target_hidden if method == EAGLE3 else layer.hidden_size)
    fc_shape = names.shape("fc.weight") if "fc.weight" in names else None
    if use_fc and fc_shape != (layer.hidden_size, fc_in):
        raise CheckpointError(f"fc.weight has shape {fc_shape}; a head of hidden size {layer.hidden_size} for a "
                              f"target of hidden size {H} needs {(layer.hidden_size, fc_in)}")
    prefix = _LAYER_PREFIX[method]
    if method == EAGLE:
        return EagleConfig(EAGLE, layer, target_hidden, V, V, fc_bias="fc.bias" in names,
                           input_layernorm=prefix + "input_layernorm.weight" in names)
    eagle_cfg = body.get("eagle_config") or {}
    ids = body.get("eagle_aux_hidden_state_layer_ids") or eagle_cfg.get("eagle_aux_hidden_state_layer_ids")
    if use_fc:
        try:
            ids = tuple(int(j) for j in ids) if ids else default_aux_layer_ids(target_cfg.num_hidden_layers)
        except (TypeError, ValueError):
            raise CheckpointError("eagle_aux_hidden_state_layer_ids must be a list of layer numbers, "
                                  f"got {ids!r}") from None
        if max(ids) > target_cfg.num_hidden_layers:
            raise CheckpointError(f"eagle_aux_hidden_state_layer_ids {list(ids)} name layers the target "
                                  f"({target_cfg.num_hidden_layers} layers) does not have")
    else:
        ids = ()  # vLLM hands an fc-less head the target's last hidden state and captures no aux layers
    own_embed = layer.hidden_size != H
    if own_embed and "embed_tokens.weight" not in names:
        raise CheckpointError(f"an EAGLE-3 head of hidden size {layer.hidden_size} for a target of hidden size {H} "
                              "must carry embed_tokens.weight")
    return EagleConfig(EAGLE3, layer, target_hidden, V, int(body.get("draft_vocab_size") or V),
                       fc_bias=use_fc and "fc.bias" in names, input_layernorm=True, aux_layer_ids=ids,
                       norm_before_residual=bool(body.get("norm_before_residual", False)), own_embeddings=own_embed,
                       num_layers=layers, use_fc=use_fc)


def _layer_state(cfg: EagleConfig, names: _Names) -> dict[str, torch.Tensor]:
    """hyspec names (``layer.*``, fused qkv / gate_up) from the public per-projection tensors; an EAGLE-3
    head's later layers (``layers.N.*``, N >= 1: H-wide q/k/v, an input_layernorm) as ``later_layers.{N-1}.*``."""
    state = _decoder_layer_state(cfg, names, _LAYER_PREFIX[cfg.method], "layer.",
                                 first_eagle3=cfg.method == EAGLE3, input_layernorm=cfg.input_layernorm)
    for n in range(1, cfg.num_layers):
        state.update(_decoder_layer_state(cfg, names, f"layers.{n}.", f"later_layers.{n - 1}.",
                                          first_eagle3=False, input_layernorm=True))
    return state


def _decoder_layer_state(cfg: EagleConfig, names: _Names, prefix: str, into: str, first_eagle3: bool,
                         input_layernorm: bool) -> dict[str, torch.Tensor]:
    lc = cfg.layer
    H, I = lc.hidden_size, lc.intermediate_size
    A = 2 * H if first_eagle3 else H  # attention input width
    q, kv = lc.num_attention_heads * lc.head_dim, lc.num_key_value_heads * lc.head_dim
    a, m = prefix + "self_attn.", prefix + "mlp."
    state = {
        into + "self_attn.qkv_proj.weight": torch.cat([names.get(a + "q_proj.weight", (q, A)),
                                                       names.get(a + "k_proj.weight", (kv, A)),
                                                       names.get(a + "v_proj.weight", (kv, A))]),
        into + "self_attn.o_proj.weight": names.get(a + "o_proj.weight", (H, q)),
        into + "mlp.gate_up_proj.weight": torch.cat([names.get(m + "gate_proj.weight", (I, H)),
                                                     names.get(m + "up_proj.weight", (I, H))]),
        into + "mlp.down_proj.weight": names.get(m + "down_proj.weight", (H, I)),
        into + "post_attention_layernorm.weight": names.get(prefix + "post_attention_layernorm.weight", (H,)),
    }
    if lc.qkv_bias:
        state[into + "self_attn.qkv_proj.bias"] = torch.cat([names.get(a + "q_proj.bias", (q,)),
                                                             names.get(a + "k_proj.bias", (kv,)),
                                                             names.get(a + "v_proj.bias", (kv,))])
    if lc.o_bias:
        state[into + "self_attn.o_proj.bias"] = names.get(a + "o_proj.bias", (H,))
    if lc.mlp_bias:
        state[into + "mlp.gate_up_proj.bias"] = torch.cat([names.get(m + "gate_proj.bias", (I,)),
                                                           names.get(m + "up_proj.bias", (I,))])
        state[into + "mlp.down_proj.bias"] = names.get(m + "down_proj.bias", (H,))
    if input_layernorm:
        state[into + "input_layernorm.weight"] = names.get(prefix + "input_layernorm.weight", (H,))
    if lc.qk_norm:  # a Qwen3 layer (speculators' qwen3 transformer_layer_config)
        for norm in ("q_norm", "k_norm"):
            state[into + f"self_attn.{norm}.weight"] = names.get(a + f"{norm}.weight", (lc.head_dim,))
    return state


def _head_state(cfg: EagleConfig, names: _Names) -> dict[str, torch.Tensor]:
    H = cfg.hidden_size
    state = _layer_state(cfg, names)
    if cfg.use_fc:
        state["fc.weight"] = names.get("fc.weight", (H, cfg.feature_size if cfg.method == EAGLE3 else 2 * H))
        if cfg.fc_bias:
            state["fc.bias"] = names.get("fc.bias", (H,))
    if cfg.method == EAGLE3:
        Vd, V = cfg.draft_vocab_size, cfg.vocab_size
        state["layer.hidden_norm.weight"] = names.get("midlayer.hidden_norm.weight", (H,))
        state["norm.weight"] = names.get("norm.weight", (H,))
        state["lm_head.weight"] = names.get("lm_head.weight", (Vd, H))
        if cfg.own_embeddings:
            state["embed_tokens.weight"] = names.get("embed_tokens.weight", (V, H))
    return state


def _vocabulary(cfg: EagleConfig, names: _Names) -> torch.Tensor:  # [draft_vocab] target ids
    """The target id of every draft id, checked: in range, distinct, and agreeing with t2d when given."""
    Vd, V = cfg.draft_vocab_size, cfg.vocab_size
    if "d2t" not in names:
        if Vd != V:
            raise CheckpointError(f"the head drafts over {Vd} of {V} tokens but has no d2t map")
        return torch.arange(V)
    ids = torch.arange(Vd) + names.get("d2t", (Vd,)).to(torch.int64)
    if int(ids.min()) < 0 or int(ids.max()) >= V or torch.unique(ids).numel() != Vd:
        raise CheckpointError(f"d2t maps draft ids outside [0, {V}) or onto the same target id twice: corrupt")
    if "t2d" in names:
        t2d = names.get("t2d", (V,)).to(torch.bool)
        expected = torch.zeros(V, dtype=torch.bool)
        expected[ids] = True
        if not torch.equal(t2d, expected):
            raise CheckpointError("t2d disagrees with d2t (a different draft vocabulary): corrupt checkpoint")
    return ids


def _embeddings_differ_from_targets(cfg: EagleConfig, names: _Names, target_weight: torch.Tensor) -> bool:
    """An EAGLE-3 file's ``embed_tokens`` of the target's shape is the target's copy (speculators saves one)
    unless it differs: then the head was trained with its own, and sharing the target's would draft wrong.
    vLLM decides the same way (torch.equal against the target's embedding)."""
    if cfg.method != EAGLE3 or cfg.own_embeddings or "embed_tokens.weight" not in names:
        return False
    own = names.get("embed_tokens.weight", (cfg.vocab_size, cfg.hidden_size))
    target = target_weight.detach()
    return target.shape != own.shape or not torch.equal(own.to(device=target.device, dtype=target.dtype), target)


def load_head(
    path: str | Path,
    target: CausalLM,
    method: str,
    dtype: torch.dtype | None = None,
    device: str | torch.device | None = None,
    ops: OpTable | None = None,
    max_positions: int | None = None,
) -> EagleHeadBase:
    """Load an EAGLE (``method="eagle"``) or EAGLE-3 (``"eagle3"``) head for ``target``."""
    path = Path(path)
    raw = read_config(path)
    names = _Names(StoredTensors(path))
    cfg = eagle_config(raw, names, method, target.config)
    weight = target.embed_tokens.weight
    if _embeddings_differ_from_targets(cfg, names, weight):
        cfg = dataclasses.replace(cfg, own_embeddings=True)
        log.info("the EAGLE-3 head's embed_tokens differ from the target's: the head uses its own (as vLLM does)")
    dtype = dtype or weight.dtype
    device = torch.device(device) if device is not None else weight.device
    state = {k: v.to(dtype) for k, v in _head_state(cfg, names).items()}
    bad = [k for k, v in state.items() if not bool(torch.isfinite(v).all())]
    if bad:
        raise CheckpointError(f"tensor {bad[0]!r} of the EAGLE head in {path} holds NaN or inf: corrupt checkpoint")
    with torch.device("meta"):
        head = build_head(cfg, target, ops, max_positions)
    head.load_state_dict(state, strict=False, assign=True)
    missing = [n for n, p in head.named_parameters() if p.is_meta]
    if missing:
        raise CheckpointError(f"the EAGLE head in {path} does not provide {missing[:4]}")
    head.cos_sin = cos_sin_cache(cfg.layer, head.max_positions)  # meta-device buffers are recomputed, not loaded
    if isinstance(head, Eagle3Head):
        ids = _vocabulary(cfg, names)
        head.d2t = torch.zeros(cfg.draft_vocab_size, dtype=torch.int64)
        head.t2d = torch.zeros(cfg.vocab_size, dtype=torch.bool)
        head.set_vocabulary(ids)
    ignored = sorted(n for n in names.names if n.startswith("embed_tokens") and not cfg.own_embeddings)
    if ignored:
        log.info("the EAGLE head's %s is ignored: the target's embeddings are shared", ignored[0])
    return head.to(device).eval().requires_grad_(False)


def read_public_tensors(path: str | Path, method: str, target_cfg: ModelConfig) -> tuple[EagleConfig, dict[str, torch.Tensor]]:
    """A head checked against ``target_cfg`` (config, every tensor's shape, d2t / t2d) and its tensors under
    their public names (a ``model.`` prefix dropped), int8 storage dequantized to fp32; an EAGLE-1/2 head's
    embeddings are left out (it shares the target's).  What a converter to another engine's layout writes."""
    path = Path(path)
    names = _Names(StoredTensors(path))
    cfg = eagle_config(read_config(path), names, method, target_cfg)
    _head_state(cfg, names)  # every tensor the head reads is present, with its shape
    if method == EAGLE3:
        _vocabulary(cfg, names)
    # An EAGLE-3 file's embed_tokens is kept: vLLM, like load_head, uses it unless it equals the target's.
    kept = sorted(n for n in names.names if not (n.startswith("embed_tokens") and method != EAGLE3))
    return cfg, {n: names.get(n, names.shape(n)) for n in kept}


# -- saving -----------------------------------------------------------------------------------


def _refuse_writing(cfg: EagleConfig) -> None:
    if cfg.num_layers != 1 or not cfg.use_fc:
        shape = f"{cfg.num_layers} decoder layers" + ("" if cfg.use_fc else " and no fc")
        raise CheckpointError(f"this EAGLE-3 head has {shape}: hyspec writes (save_head, hyspec export-drafter "
                              "eagle3) one-layer heads behind fc only; serve the published directory as it is "
                              "(hyspec and vLLM's llama_eagle3.py both read it)")


def head_tensors(head: EagleHeadBase) -> dict[str, torch.Tensor]:
    """Every saved weight of ``head`` under its public name (target weights excluded)."""
    cfg = head.config
    _refuse_writing(cfg)
    lc, prefix = cfg.layer, _LAYER_PREFIX[cfg.method]
    q, kv, I = lc.num_attention_heads * lc.head_dim, lc.num_key_value_heads * lc.head_dim, lc.intermediate_size
    layer, a, m = head.layer, prefix + "self_attn.", prefix + "mlp."
    out: dict[str, torch.Tensor] = {"fc.weight": head.fc.weight}
    if head.fc.bias is not None:
        out["fc.bias"] = head.fc.bias
    qw, kw, vw = layer.self_attn.qkv_proj.weight.split([q, kv, kv])
    out.update({a + "q_proj.weight": qw, a + "k_proj.weight": kw, a + "v_proj.weight": vw,
                a + "o_proj.weight": layer.self_attn.o_proj.weight})
    if layer.self_attn.qkv_proj.bias is not None:
        qb, kb, vb = layer.self_attn.qkv_proj.bias.split([q, kv, kv])
        out.update({a + "q_proj.bias": qb, a + "k_proj.bias": kb, a + "v_proj.bias": vb})
    if layer.self_attn.o_proj.bias is not None:
        out[a + "o_proj.bias"] = layer.self_attn.o_proj.bias
    gate, up = layer.mlp.gate_up_proj.weight.split(I)
    out.update({m + "gate_proj.weight": gate, m + "up_proj.weight": up, m + "down_proj.weight": layer.mlp.down_proj.weight})
    if layer.mlp.gate_up_proj.bias is not None:
        gb, ub = layer.mlp.gate_up_proj.bias.split(I)
        out.update({m + "gate_proj.bias": gb, m + "up_proj.bias": ub, m + "down_proj.bias": layer.mlp.down_proj.bias})
    out[prefix + "post_attention_layernorm.weight"] = layer.post_attention_layernorm.weight
    if layer.input_layernorm is not None:
        out[prefix + "input_layernorm.weight"] = layer.input_layernorm.weight
    if layer.self_attn.q_norm is not None:
        out.update({a + "q_norm.weight": layer.self_attn.q_norm.weight, a + "k_norm.weight": layer.self_attn.k_norm.weight})
    if isinstance(head, Eagle3Head):
        out.update({prefix + "hidden_norm.weight": layer.hidden_norm.weight, "norm.weight": head.norm.weight,
                    "lm_head.weight": head.lm_head.weight, "d2t": head.d2t, "t2d": head.t2d})
        if head.embed_tokens is not None:
            out["embed_tokens.weight"] = head.embed_tokens.weight
    return {k: v.detach().cpu().contiguous() for k, v in out.items()}


def head_config_dict(head: EagleHeadBase) -> dict[str, Any]:
    """The head's config.json body, in the layout SafeAILab / vLLM / SGLang read."""
    _refuse_writing(head.config)
    return eagle_config_dict(head.config, head.fc.weight.dtype, head.fc.bias is not None)


def eagle_config_dict(cfg: EagleConfig, dtype: torch.dtype, fc_bias: bool) -> dict[str, Any]:
    """An EAGLE head's config.json body from its :class:`EagleConfig` (weights in ``dtype``)."""
    _refuse_writing(cfg)
    lc = cfg.layer
    raw = lc.raw
    d: dict[str, Any] = {
        "architectures": [ARCHITECTURES[cfg.method]], "model_type": "llama", "hidden_act": "silu",
        "hidden_size": lc.hidden_size, "intermediate_size": lc.intermediate_size, "num_hidden_layers": 1,
        "num_attention_heads": lc.num_attention_heads, "num_key_value_heads": lc.num_key_value_heads,
        "head_dim": lc.head_dim, "rms_norm_eps": lc.rms_norm_eps, "vocab_size": cfg.vocab_size,
        "max_position_embeddings": lc.max_position_embeddings, "tie_word_embeddings": False,
        "attention_bias": lc.o_bias, "mlp_bias": lc.mlp_bias,
        "torch_dtype": str(dtype).removeprefix("torch."),
        "bias": fc_bias,  # SafeAILab's loader builds fc from this (default True)
    }
    d.update({k: raw[k] for k in ("rope_theta", "rope_scaling", "rope_parameters", "bos_token_id", "eos_token_id",
                                  "pad_token_id") if raw.get(k) is not None})
    d.setdefault("rope_theta", lc.rope.theta)
    if cfg.method == EAGLE3:
        ids = list(cfg.aux_layer_ids)
        d.update({"draft_vocab_size": cfg.draft_vocab_size, "target_hidden_size": cfg.target_hidden_size,
                  "eagle_aux_hidden_state_layer_ids": ids, "norm_before_residual": cfg.norm_before_residual,
                  "eagle_config": {"eagle_aux_hidden_state_layer_ids": ids, "use_aux_hidden_state": True}})
    return d


def save_head(head: EagleHeadBase, out_dir: str | Path, storage: str | None = None) -> None:
    """Write ``model.safetensors`` then ``config.json`` (last, so a directory with it is complete).

    ``storage`` (:data:`~hyspec.drafters.checkpoint_io.STORAGE`) shrinks the file; ``int8`` is hyspec's
    own per-row layout, which other engines do not read.
    """
    tensors = stored_tensors(head_tensors(head), storage)
    config = head_config_dict(head)
    if storage is not None:
        config["torch_dtype"] = "bfloat16" if storage == "int8" else storage
        config["hyspec_storage"] = storage  # int8: the large matrices; norms and small tensors stay bf16
    save_checkpoint(out_dir, tensors, config)
