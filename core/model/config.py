"""Target-model configuration read from a Hugging Face ``config.json``.

Supported: decoder-only Llama, Mistral, Qwen2 (qkv bias), Qwen3 (per-head
q/k RMSNorm), Phi-3 (fused qkv / gate_up tensors; longrope, hyspec.model.rope) and Gemma 2 /
Gemma 3 text (hyspec.model.gemma), and the mixture-of-experts Mixtral, Qwen2-MoE and Qwen3-MoE
(hyspec.model.moe, hyspec.model.moe_config), with GQA, tied or untied embeddings, and RoPE scaling types
``linear``, ``dynamic``, ``yarn``, ``llama3`` and ``longrope``.  Both the transformers 4
(``rope_theta`` + ``rope_scaling``) and 5 (``rope_parameters``) spellings are read.
"""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from hyspec.errors import CheckpointError
from hyspec.model.gguf_checkpoint import GGUFCheckpoint, is_gguf
from hyspec.model.moe_config import MOE_MODEL_TYPES, MoEConfig, moe_config_from_dict

log = logging.getLogger(__name__)

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3", "phi3", "gemma2", "gemma3_text") + MOE_MODEL_TYPES
#: the dense model type whose sliding-window rule a MoE type follows (transformers' modeling files)
_WINDOW_TWIN = {"mixtral": "mistral", "qwen2_moe": "qwen2", "qwen3_moe": "qwen3"}
#: model types built by hyspec.model.gemma: (1+w) RMSNorms, scaled embeddings, GeGLU, four norms a layer
GEMMA_MODEL_TYPES = ("gemma2", "gemma3_text")
SUPPORTED_ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "llama3", "longrope")
#: transformers' Phi3Config default for a config.json without original_max_position_embeddings
PHI3_ORIGINAL_CONTEXT = 4096

DTYPES = {
    "float32": torch.float32, "fp32": torch.float32, "float": torch.float32,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "float16": torch.float16, "fp16": torch.float16, "half": torch.float16,
}


def parse_dtype(value: str | torch.dtype | None, default: torch.dtype = torch.float32) -> torch.dtype:
    if value is None or value == "auto":
        return default
    if isinstance(value, torch.dtype):
        if value not in DTYPES.values():
            raise CheckpointError(f"dtype {value} is not supported; use float32, bfloat16 or float16")
        return value
    name = str(value).removeprefix("torch.")
    if name not in DTYPES:
        raise CheckpointError(f"dtype {value!r} is not supported; use one of float32, bfloat16, float16, auto")
    return DTYPES[name]


@dataclass(frozen=True)
class RopeConfig:
    rope_type: str = "default"
    theta: float = 10000.0
    factor: float = 1.0
    original_max_position_embeddings: int | None = None
    low_freq_factor: float = 1.0  # llama3
    high_freq_factor: float = 4.0  # llama3
    beta_fast: float = 32.0  # yarn
    beta_slow: float = 1.0  # yarn
    attention_factor: float | None = None  # yarn, longrope
    mscale: float | None = None  # yarn
    mscale_all_dim: float | None = None  # yarn
    truncate: bool = True  # yarn
    #: per-frequency divisors of the inverse frequencies, [head_dim // 2]: how llama.cpp's converter stores
    #: llama3 scaling in a GGUF (the ``rope_freqs.weight`` tensor); None: none
    freq_factors: tuple[float, ...] | None = None
    #: longrope: per-frequency divisors [head_dim // 2] for short and for long contexts
    short_factor: tuple[float, ...] | None = None
    long_factor: tuple[float, ...] | None = None
    #: longrope: cos / sin multipliers replacing the attention factor in each regime (vLLM's keys); None: absent
    short_mscale: float | None = None
    long_mscale: float | None = None
    #: longrope: the longest sequence the model will serve (an engine's max_model_len); it fixes the factor set
    #: for every sequence (long where it exceeds original_max_position_embeddings).  None: the RoPE table's length
    context_length: int | None = None

    def __post_init__(self) -> None:
        if self.freq_factors is not None and not all(f > 0 for f in self.freq_factors):
            raise CheckpointError("RoPE frequency factors (GGUF rope_freqs) must all be positive")
        if self.rope_type == "longrope":
            self._check_longrope()
        if self.rope_type not in SUPPORTED_ROPE_TYPES:
            raise CheckpointError(
                f"rope_scaling type {self.rope_type!r} is not supported; supported: {', '.join(SUPPORTED_ROPE_TYPES)}")
        if self.theta <= 0 or self.factor <= 0:
            raise CheckpointError("rope_theta and rope_scaling.factor must be positive")

    def _check_longrope(self) -> None:
        for name in ("short_factor", "long_factor"):
            factors = getattr(self, name)
            if factors is None:
                raise CheckpointError(f"config.json: rope_scaling type 'longrope' needs {name} (a list of numbers)")
            if not all(f > 0 for f in factors):
                raise CheckpointError(f"config.json: rope_scaling.{name} must hold positive numbers")
        if len(self.short_factor) != len(self.long_factor):
            raise CheckpointError(f"config.json: rope_scaling.short_factor has {len(self.short_factor)} entries, "
                                  f"long_factor {len(self.long_factor)}")
        if not self.original_max_position_embeddings or self.original_max_position_embeddings < 1:
            raise CheckpointError("config.json: rope_scaling type 'longrope' needs a positive "
                                  "original_max_position_embeddings")
        for name in ("short_mscale", "long_mscale", "attention_factor"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise CheckpointError(f"config.json: rope_scaling.{name} must be positive, got {value}")
        if self.attention_factor is not None and (self.short_mscale is not None or self.long_mscale is not None):
            # vLLM follows the mscales and drops attention_factor, transformers the reverse: no rule to follow
            raise CheckpointError("config.json: longrope rope_scaling with both attention_factor and "
                                  "short_mscale / long_mscale is not supported (transformers applies the first, "
                                  "vLLM the second)")
        if self.context_length is not None and self.context_length < 1:
            raise CheckpointError(f"longrope context length must be positive, got {self.context_length}")


@dataclass(frozen=True)
class ModelConfig:
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool  # q/k/v projections carry a bias (Qwen2; Llama with attention_bias)
    o_bias: bool  # o_proj carries a bias (Llama with attention_bias)
    mlp_bias: bool
    qk_norm: bool  # per-head RMSNorm on q and k before RoPE (Qwen3)
    rope: RopeConfig = field(default_factory=RopeConfig)
    #: per layer: how many positions back attention reaches (a query at p sees keys at p - w + 1 .. p), None:
    #: full causal attention.  From ``sliding_window`` (Mistral: every layer), ``use_sliding_window`` +
    #: ``max_window_layers`` (Qwen2 / Qwen3: layers from max_window_layers on) or ``layer_types``.
    layer_windows: tuple[int | None, ...] = ()
    #: vLLM's ``disable_sliding_window``: every layer attends fully; ``layer_windows`` still says which layers
    #: are the sliding kind (Gemma 3 rotates those with its local RoPE table, as vLLM does)
    sliding_windows_disabled: bool = False
    hidden_act: str = "silu"  # the MLP's gate activation: silu, or gelu_pytorch_tanh (Gemma's GeGLU)
    #: Gemma 2: attention scores become ``c * tanh(s / c)`` before the softmax; None: plain scores
    attn_logit_softcapping: float | None = None
    #: Gemma 2: logits become ``c * tanh(l / c)``; None: plain logits
    final_logit_softcapping: float | None = None
    #: Gemma: attention scale is ``query_pre_attn_scalar ** -0.5`` instead of ``head_dim ** -0.5``
    query_pre_attn_scalar: float | None = None
    #: Gemma 3: the RoPE of the sliding-window layers (its own base, no scaling); None: every layer uses ``rope``
    local_rope: RopeConfig | None = None
    #: Mixtral / Qwen2-MoE / Qwen3-MoE: the routed MLPs (hyspec.model.moe); None: dense MLPs
    moe: MoEConfig | None = None
    torch_dtype: str | None = None
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.model_type not in SUPPORTED_MODEL_TYPES:
            raise CheckpointError(
                f"unsupported architecture {self.model_type!r}; supported: {', '.join(SUPPORTED_MODEL_TYPES)}")
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                     "num_attention_heads", "num_key_value_heads", "head_dim", "max_position_embeddings"):
            if getattr(self, name) <= 0:
                raise CheckpointError(f"config.json: {name} must be positive, got {getattr(self, name)}")
        if self.layer_windows and len(self.layer_windows) != self.num_hidden_layers:
            raise CheckpointError(f"config.json: {len(self.layer_windows)} attention window entries for "
                                  f"{self.num_hidden_layers} layers")
        if any(w is not None and w < 1 for w in self.layer_windows):
            raise CheckpointError(f"config.json: sliding_window must be positive, got {self.layer_windows}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise CheckpointError(
                f"config.json: num_attention_heads ({self.num_attention_heads}) is not a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads})")

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "ModelConfig":
        model_type = d.get("model_type")
        if model_type not in SUPPORTED_MODEL_TYPES:
            archs = d.get("architectures")
            raise CheckpointError(
                f"unsupported architecture {model_type!r} ({archs}); supported model_type values: "
                f"{', '.join(SUPPORTED_MODEL_TYPES)}")
        partial = (d.get("rope_parameters") or {}).get("partial_rotary_factor", d.get("partial_rotary_factor", 1.0))
        if partial not in (None, 1, 1.0):  # transformers rotates only that fraction of each head
            raise CheckpointError(f"config.json: partial_rotary_factor {partial} is not supported (RoPE over the "
                                  "whole head only)")
        gemma = model_type in GEMMA_MODEL_TYPES
        if gemma:  # transformers' Gemma reads hidden_activation (hidden_act is a legacy duplicate)
            hidden_act = d.get("hidden_activation") or d.get("hidden_act") or "gelu_pytorch_tanh"
            if hidden_act != "gelu_pytorch_tanh":
                raise CheckpointError(f"config.json: hidden_activation {hidden_act!r} is not supported for "
                                      f"{model_type} (only 'gelu_pytorch_tanh')")
        else:
            hidden_act = d.get("hidden_act", "silu")
            if hidden_act != "silu":
                raise CheckpointError(f"config.json: hidden_act {hidden_act!r} is not supported (only 'silu')")
        scaling = {**(d.get("rope_scaling") or {}), **(d.get("rope_parameters") or {})}
        phi3_rope = scaling.get("rope_type") or scaling.get("type") or "default"
        if model_type == "phi3" and phi3_rope not in ("default", "longrope", "su"):
            raise CheckpointError(  # transformers' Phi3Config rejects them too (it reads 'yarn' as longrope)
                f"config.json: Phi-3 rope_scaling {phi3_rope!r} is not supported; Phi-3 runs default RoPE or "
                "'longrope' (older name 'su')")
        global_rope, local_rope = _gemma3_ropes(d) if model_type == "gemma3_text" else (_rope_from_dict(d), None)
        heads = int(d["num_attention_heads"])
        try:
            hidden = int(d["hidden_size"])
            eos = d.get("eos_token_id")
            eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (int(eos),))
            attention_bias = bool(d.get("attention_bias", False))
            if model_type == "qwen2_moe":  # transformers' Qwen2-MoE: q/k/v biases from qkv_bias, none on o_proj
                attention_bias = False
            _check_moe_windows(d, model_type)
            return cls(
                model_type=model_type,
                vocab_size=int(d["vocab_size"]),
                hidden_size=hidden,
                intermediate_size=int(d["intermediate_size"]),
                num_hidden_layers=int(d["num_hidden_layers"]),
                num_attention_heads=heads,
                num_key_value_heads=int(d.get("num_key_value_heads") or heads),
                head_dim=int(d.get("head_dim") or hidden // heads),
                rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
                max_position_embeddings=int(d.get("max_position_embeddings", 2048)),
                tie_word_embeddings=bool(d.get("tie_word_embeddings", gemma)),  # Gemma's default: tied
                qkv_bias=(model_type == "qwen2") or attention_bias or (
                    model_type == "qwen2_moe" and bool(d.get("qkv_bias", True))),
                o_bias=attention_bias and model_type != "qwen2",
                mlp_bias=bool(d.get("mlp_bias", False)),
                qk_norm=model_type in ("qwen3", "qwen3_moe", "gemma3_text"),
                rope=global_rope,
                layer_windows=_layer_windows(d, _WINDOW_TWIN.get(model_type, model_type), int(d["num_hidden_layers"])),
                moe=moe_config_from_dict(d, model_type, int(d["num_hidden_layers"])),
                hidden_act=hidden_act,
                attn_logit_softcapping=_attention_softcap(d, model_type),
                final_logit_softcapping=_optional_float(d, "final_logit_softcapping") if gemma else None,
                query_pre_attn_scalar=_optional_float(d, "query_pre_attn_scalar") if gemma else None,
                local_rope=local_rope,
                torch_dtype=d.get("torch_dtype") or d.get("dtype"),
                bos_token_id=d.get("bos_token_id"),
                eos_token_ids=eos_ids,
                raw=d,
            )
        except KeyError as exc:
            raise CheckpointError(f"config.json is missing required key {exc.args[0]!r}") from None

    @classmethod
    def from_pretrained(cls, path: str | Path) -> "ModelConfig":
        """From a Hugging Face directory's ``config.json``, or from a GGUF file's metadata."""
        path = Path(path)
        if is_gguf(path):
            return cls.from_dict(GGUFCheckpoint(path).hf_config())
        cfg_file = path / "config.json"
        if not path.is_dir():
            raise CheckpointError(f"model directory {str(path)!r} does not exist")
        if not cfg_file.is_file():
            raise CheckpointError(f"{cfg_file} not found: a Hugging Face model directory needs config.json")
        try:
            data = json.loads(cfg_file.read_text())
        except json.JSONDecodeError as exc:
            raise CheckpointError(f"{cfg_file} is not valid JSON: {exc}") from None
        return cls.from_dict(data)

    @staticmethod
    def raw_dict(path: str | Path) -> dict[str, Any]:
        """The Hugging Face config as a dict: ``config.json``, or what a GGUF file's metadata amounts to."""
        path = Path(path)
        if is_gguf(path):
            return GGUFCheckpoint(path).hf_config()
        return json.loads((path / "config.json").read_text())

    def for_context(self, context_length: int) -> "ModelConfig":
        """This config serving sequences of up to ``context_length`` tokens: longrope's factor set fixed by it
        (hyspec.model.rope); other RoPE types do not depend on it."""
        if self.rope.rope_type != "longrope":
            return self
        return replace(self, rope=replace(self.rope, context_length=int(context_length)))

    def sliding_window(self, layer: int, max_positions: int) -> int | None:
        """Layer ``layer``'s attention window where it can cut anything within ``max_positions`` (a window at
        least that long is full attention), else None."""
        window = self.layer_windows[layer] if self.layer_windows and not self.sliding_windows_disabled else None
        return window if window is not None and window < max_positions else None

    @property
    def configured_sliding_window(self) -> int | None:
        """The window the sliding layers are configured with (None: no layer has one), disabled or not."""
        return max((w for w in self.layer_windows if w is not None), default=None)

    def without_sliding_windows(self) -> "ModelConfig":
        """vLLM's ``disable_sliding_window``: full attention on every layer."""
        return replace(self, sliding_windows_disabled=True)

    @property
    def kv_bytes_per_token(self) -> int:
        """Bytes of K and V per token across all layers, at 2 bytes (bf16) per element."""
        return 2 * self.num_hidden_layers * self.num_key_value_heads * self.head_dim * 2


def _layer_windows(d: dict[str, Any], model_type: str, num_layers: int) -> tuple[int | None, ...]:
    """Each layer's sliding window, as transformers decides it for the model type (configuration_*.py and
    modeling_*.py): Llama has none; Mistral applies ``sliding_window`` to every layer; Qwen2 / Qwen3 only with
    ``use_sliding_window``, on the layers ``layer_types`` marks ``sliding_attention`` (by default those from
    ``max_window_layers`` on)."""
    window = d.get("sliding_window")
    if model_type == "llama":
        return ()
    if model_type in ("qwen2", "qwen3") and not d.get("use_sliding_window", False):
        window = None
    if window is None:
        return ()
    if isinstance(window, bool) or not isinstance(window, int):
        raise CheckpointError(f"config.json: sliding_window must be an integer or null, got {window!r}")
    if model_type in ("mistral", "phi3"):  # transformers' Mistral / Phi-3 window every layer, ignore layer_types
        return (window,) * num_layers
    types = d.get("layer_types")
    if types is None and model_type in GEMMA_MODEL_TYPES:
        # transformers' defaults: Gemma 2 alternates (sliding first), Gemma 3 has one full layer in each
        # sliding_window_pattern (every 6th)
        pattern = 2 if model_type == "gemma2" else int(d.get("sliding_window_pattern", 6))
        types = ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(num_layers)]
    if types is None:
        first = int(d.get("max_window_layers", 28))
        types = ["sliding_attention" if i >= first else "full_attention" for i in range(num_layers)]
    if len(types) != num_layers:
        raise CheckpointError(f"config.json: layer_types has {len(types)} entries for {num_layers} layers")
    unknown = sorted(set(types) - {"sliding_attention", "full_attention"})
    if unknown:
        raise CheckpointError(f"config.json: layer_types {unknown} are not supported (only full_attention and "
                              "sliding_attention)")
    return tuple(window if t == "sliding_attention" else None for t in types)


def _check_moe_windows(d: dict[str, Any], model_type: str) -> None:
    """Qwen2-MoE / Qwen3-MoE place their sliding windows unlike the dense Qwens (transformers: Qwen2-MoE on odd
    layers below max_window_layers, Qwen3-MoE on every layer); hyspec does not implement either placement."""
    if model_type in ("qwen2_moe", "qwen3_moe") and d.get("use_sliding_window", False):
        raise CheckpointError(f"config.json: {model_type} with use_sliding_window is not supported (its window "
                              "placement is not implemented); the published Qwen MoE checkpoints have it off")


def _optional_float(d: dict[str, Any], key: str) -> float | None:
    value = d.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise CheckpointError(f"config.json: {key} must be a positive number or null, got {value!r}")
    return float(value)


def _attention_softcap(d: dict[str, Any], model_type: str) -> float | None:
    """Gemma 2's ``attn_logit_softcapping``.  transformers' Gemma 3 keeps the key but never passes it to its
    attention (modeling_gemma3.py), and Gemma 3 checkpoints set it null: it is not applied there either, and a
    non-null value is logged rather than followed."""
    cap = _optional_float(d, "attn_logit_softcapping") if model_type in GEMMA_MODEL_TYPES else None
    if cap is not None and model_type == "gemma3_text":
        log.warning("config.json: attn_logit_softcapping %s is not applied to gemma3_text attention, as "
                    "transformers' Gemma 3 does not apply it", cap)
        return None
    return cap


def _gemma3_ropes(d: dict[str, Any]) -> tuple[RopeConfig, RopeConfig]:
    """Gemma 3's (global, local) RoPE: transformers 5 writes ``rope_parameters`` per layer type; transformers 4
    wrote ``rope_theta`` + ``rope_scaling`` for the full-attention layers and ``rope_local_base_freq`` (no
    scaling) for the sliding ones."""
    params = d.get("rope_parameters") or {}
    if "full_attention" in params or "sliding_attention" in params:
        def of(kind: str) -> RopeConfig:
            return _rope_from_dict({"rope_parameters": params.get(kind) or {},
                                    "max_position_embeddings": d.get("max_position_embeddings")})
        return of("full_attention"), of("sliding_attention")
    local = RopeConfig(theta=float(d.get("rope_local_base_freq", 10000.0)))
    return _rope_from_dict(d), local


def _rope_from_dict(d: dict[str, Any]) -> RopeConfig:
    params = dict(d.get("rope_parameters") or {})
    scaling = d.get("rope_scaling") or {}
    params = {**scaling, **params}
    theta = float(params.get("rope_theta", d.get("rope_theta", 10000.0)))
    rope_type = params.get("rope_type") or params.get("type") or "default"
    if rope_type == "su":  # longrope's first name (Phi-3's early configs), as transformers and vLLM read it
        rope_type = "longrope"
    if rope_type == "longrope":
        return _longrope_from_dict(d, params, theta)
    if rope_type == "dynamic" and "factor" not in params:
        raise CheckpointError("config.json: rope_scaling type 'dynamic' needs 'factor'")
    orig = params.get("original_max_position_embeddings")
    if rope_type in ("yarn", "llama3") and orig is None:
        if rope_type == "llama3":
            raise CheckpointError("config.json: rope_scaling type 'llama3' needs original_max_position_embeddings")
        orig = d.get("max_position_embeddings")
    return RopeConfig(
        rope_type=rope_type,
        theta=theta,
        factor=float(params.get("factor") or 1.0),
        original_max_position_embeddings=None if orig is None else int(orig),
        low_freq_factor=float(params.get("low_freq_factor", 1.0)),
        high_freq_factor=float(params.get("high_freq_factor", 4.0)),
        beta_fast=float(params.get("beta_fast") or 32.0),
        beta_slow=float(params.get("beta_slow") or 1.0),
        attention_factor=params.get("attention_factor"),
        mscale=params.get("mscale"),
        mscale_all_dim=params.get("mscale_all_dim"),
        truncate=bool(params.get("truncate", True)),
        freq_factors=None if d.get("rope_freq_factors") is None else tuple(float(f) for f in d["rope_freq_factors"]),
    )


def _longrope_from_dict(d: dict[str, Any], params: dict[str, Any], theta: float) -> RopeConfig:
    """longrope's keys as transformers reads them (modeling_rope_utils.py ``_compute_longrope_parameters``;
    configuration_phi3.py): Phi-3 takes original_max_position_embeddings from the top level (default 4096) over
    rope_scaling's; ``factor`` defaults to max_position_embeddings / original_max_position_embeddings."""
    top, inner = d.get("original_max_position_embeddings"), params.get("original_max_position_embeddings")
    if d.get("model_type") == "phi3":
        orig = PHI3_ORIGINAL_CONTEXT if top is None else top
        if inner is not None and int(inner) != int(orig):
            raise CheckpointError(f"config.json: rope_scaling.original_max_position_embeddings {inner} disagrees "
                                  f"with original_max_position_embeddings {orig}, which transformers' Phi-3 uses")
    else:
        orig = inner if inner is not None else d.get("max_position_embeddings")
    if orig is None:
        raise CheckpointError("config.json: rope_scaling type 'longrope' needs original_max_position_embeddings")
    lists = {}
    for name in ("short_factor", "long_factor"):
        value = params.get(name)
        if value is None:
            raise CheckpointError(f"config.json: rope_scaling type 'longrope' needs {name} (a list of numbers)")
        if not isinstance(value, (list, tuple)) or not all(
                isinstance(x, (int, float)) and not isinstance(x, bool) for x in value):
            raise CheckpointError(f"config.json: rope_scaling.{name} must be a list of numbers, got {value!r}")
        lists[name] = tuple(float(x) for x in value)
    factor = params.get("factor")
    if factor is None:
        factor = int(d.get("max_position_embeddings", 2048)) / int(orig)

    def optional(key: str) -> float | None:
        return None if params.get(key) is None else float(params[key])

    return RopeConfig(rope_type="longrope", theta=theta, factor=float(factor),
                      original_max_position_embeddings=int(orig), attention_factor=optional("attention_factor"),
                      short_mscale=optional("short_mscale"), long_mscale=optional("long_mscale"), **lists)
