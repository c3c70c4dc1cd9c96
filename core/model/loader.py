"""Load a Hugging Face Llama-family checkpoint into :class:`CausalLM`."""
from __future__ import annotations

import logging
from collections.abc import Collection
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from hyspec.errors import CheckpointError
from hyspec.model.config import GEMMA_MODEL_TYPES, ModelConfig, parse_dtype
from hyspec.model.gemma import GemmaCausalLM, local_cos_sin_cache
from hyspec.model.gguf_checkpoint import GGUFCheckpoint, is_gguf
from hyspec.model.llama import CausalLM
from hyspec.model.moe import MoECausalLM, moe_layer_state
from hyspec.model.moe_stored import plan_stored_experts
from hyspec.model.quantize_model import check_quantization, quantize_model
from hyspec.model.rope import cos_sin_cache
from hyspec.model.weights import SafetensorsCheckpoint, check_shape
from hyspec.ops import OpTable

if TYPE_CHECKING:
    from hyspec.backend import Backend

log = logging.getLogger(__name__)


def resolve_dtype(cfg: ModelConfig, dtype: str | torch.dtype | None) -> torch.dtype:
    """``auto`` keeps the checkpoint's dtype (fp32 when the config names none)."""
    if dtype in (None, "auto"):
        return parse_dtype(cfg.torch_dtype, default=torch.float32)
    return parse_dtype(dtype)


def load_model(
    path: str | Path,
    dtype: str | torch.dtype | None = "auto",
    device: str | torch.device = "cpu",
    ops: OpTable | None = None,
    max_positions: int | None = None,
    quantization: str | None = None,
    backend: "Backend | None" = None,
    context_length: int | None = None,
    disable_sliding_window: bool = False,
) -> CausalLM:
    """Build the model described by ``path/config.json`` and fill it from ``path/*.safetensors``,
    or build and fill it from one GGUF file (``path`` ending in ``.gguf``).

    With a ``backend``, its quantized kernels take the linears ``quantization`` asks for
    (hyspec.model.quantize_model: by default a GGUF's own Q4 / Q8 codes); the report of what
    was quantized is ``model.quantization``.  Without one the model is dense.

    ``context_length``: the longest sequence the caller will run (an engine's max_model_len), which fixes
    longrope's factor set (hyspec.model.rope); None: ``max_positions`` decides.
    ``disable_sliding_window``: every layer attends fully (vLLM's flag; the engine caps max_model_len to the
    window, so nothing it serves could tell).
    """
    path = Path(path)
    cfg = ModelConfig.from_pretrained(path)
    if context_length is not None:
        cfg = cfg.for_context(context_length)
    if disable_sliding_window:
        cfg = cfg.without_sliding_windows()
    torch_dtype = resolve_dtype(cfg, dtype)
    ckpt = open_checkpoint(path)
    with torch.device("meta"):
        model = model_class(cfg)(cfg, ops=ops, max_positions=max_positions)
    # a quantized GGUF's experts stay as stored where the backend computes them so (hyspec.model.moe_stored):
    # never dequantized, so the model is about the file's size
    stored = plan_stored_experts(cfg, ckpt, backend, quantization, torch_dtype)
    state = hf_state_dict(cfg, ckpt, torch_dtype, stored_expert_layers=stored.layers.keys())
    model.load_state_dict(state, strict=False, assign=True)
    stored.attach(model)
    missing = [n for n, p in model.named_parameters() if p.is_meta]
    if missing:
        raise CheckpointError(f"checkpoint in {path} does not provide {missing[:5]}")
    model.cos_sin = cos_sin_cache(cfg, model.max_positions)
    if isinstance(model, GemmaCausalLM):
        model.cos_sin_local = local_cos_sin_cache(cfg, model.max_positions)
    model = model.to(device).eval().requires_grad_(False)
    model.quantization = None
    if backend is not None:
        model.quantization = quantize_model(model, ckpt, check_quantization(quantization), backend, torch_dtype)
        stored.report_into(model.quantization)
        log.info("%s: %s", path.name, model.quantization.summary())
    elif quantization not in (None, "none"):
        raise CheckpointError(f"quantization={quantization!r} needs a backend to compute with it")
    return model


def model_class(cfg: ModelConfig) -> type[CausalLM]:
    """The module class that computes ``cfg``'s architecture."""
    if cfg.moe is not None:
        return MoECausalLM
    return GemmaCausalLM if cfg.model_type in GEMMA_MODEL_TYPES else CausalLM


def open_checkpoint(path: Path) -> SafetensorsCheckpoint | GGUFCheckpoint:
    """The tensors of a Hugging Face directory or a GGUF file, under Hugging Face names."""
    return GGUFCheckpoint(path) if is_gguf(path) else SafetensorsCheckpoint(path)


def hf_state_dict(cfg: ModelConfig, ckpt: SafetensorsCheckpoint | GGUFCheckpoint, dtype: torch.dtype,
                  prefix: str = "model.", layer_offset: int = 0, num_layers: int | None = None,
                  stored_expert_layers: Collection[int] = ()) -> dict[str, torch.Tensor]:
    """Map HF tensor names onto hyspec's module names, fusing q/k/v and gate/up, checking shapes.

    ``layer_offset``/``num_layers`` select a slice of decoder layers (drafters
    stored inside a target checkpoint, such as DeepSeek MTP layers).  ``stored_expert_layers``: routed
    layers whose experts are kept as the checkpoint stores them (hyspec.model.moe_stored), not read here.
    """
    H, I, V = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size
    q_size = cfg.num_attention_heads * cfg.head_dim
    kv_size = cfg.num_key_value_heads * cfg.head_dim

    def get(name: str, shape) -> torch.Tensor:
        return check_shape(name, ckpt.get(name), shape).to(dtype)

    state: dict[str, torch.Tensor] = {}
    used: set[str] = set()

    def take(name: str, shape) -> torch.Tensor:
        used.add(name)
        return get(name, shape)

    gemma = cfg.model_type in GEMMA_MODEL_TYPES

    def take_norm(name: str, shape) -> torch.Tensor:
        """A norm weight; Gemma's RMSNorm multiplies by ``1 + w``, folded here and kept in fp32 for the fp32
        product transformers computes (hyspec.model.gemma.gemma_rms_norm)."""
        if not gemma:
            return take(name, shape)
        used.add(name)
        return check_shape(name, ckpt.get(name), shape).float() + 1.0

    state["embed_tokens.weight"] = take(f"{prefix}embed_tokens.weight", (V, H))
    state["norm.weight"] = take_norm(f"{prefix}norm.weight", (H,))
    if not cfg.tie_word_embeddings:
        state["lm_head.weight"] = take("lm_head.weight", (V, H))
    count = cfg.num_hidden_layers if num_layers is None else num_layers
    for i in range(count):
        src, dst = f"{prefix}layers.{i + layer_offset}.", f"layers.{i}."
        a = src + "self_attn."
        if cfg.model_type == "phi3":  # stored fused, in hyspec's q | k | v and gate | up order
            state[dst + "self_attn.qkv_proj.weight"] = take(a + "qkv_proj.weight", (q_size + 2 * kv_size, H))
        else:
            state[dst + "self_attn.qkv_proj.weight"] = torch.cat([
                take(a + "q_proj.weight", (q_size, H)), take(a + "k_proj.weight", (kv_size, H)),
                take(a + "v_proj.weight", (kv_size, H))])
        if cfg.qkv_bias:
            state[dst + "self_attn.qkv_proj.bias"] = torch.cat([
                take(a + "q_proj.bias", (q_size,)), take(a + "k_proj.bias", (kv_size,)),
                take(a + "v_proj.bias", (kv_size,))])
        state[dst + "self_attn.o_proj.weight"] = take(a + "o_proj.weight", (H, q_size))
        if cfg.o_bias:
            state[dst + "self_attn.o_proj.bias"] = take(a + "o_proj.bias", (H,))
        if cfg.qk_norm:
            state[dst + "self_attn.q_norm.weight"] = take_norm(a + "q_norm.weight", (cfg.head_dim,))
            state[dst + "self_attn.k_norm.weight"] = take_norm(a + "k_norm.weight", (cfg.head_dim,))
        m = src + "mlp."
        routed = cfg.moe is not None and cfg.moe.is_sparse(i + layer_offset)  # experts (hyspec.model.moe)
        if routed:
            state.update(moe_layer_state(cfg, take, src, dst,
                                         claim=used.add if i in stored_expert_layers else None))
        elif cfg.model_type == "phi3":
            state[dst + "mlp.gate_up_proj.weight"] = take(m + "gate_up_proj.weight", (2 * I, H))
        else:
            state[dst + "mlp.gate_up_proj.weight"] = torch.cat([
                take(m + "gate_proj.weight", (I, H)), take(m + "up_proj.weight", (I, H))])
        if not routed:
            state[dst + "mlp.down_proj.weight"] = take(m + "down_proj.weight", (H, I))
        if cfg.mlp_bias:
            state[dst + "mlp.gate_up_proj.bias"] = torch.cat([take(m + "gate_proj.bias", (I,)), take(m + "up_proj.bias", (I,))])
            state[dst + "mlp.down_proj.bias"] = take(m + "down_proj.bias", (H,))
        norms = ("input_layernorm", "post_attention_layernorm") + (
            ("pre_feedforward_layernorm", "post_feedforward_layernorm") if gemma else ())
        for norm in norms:
            state[f"{dst}{norm}.weight"] = take_norm(f"{src}{norm}.weight", (H,))
    if num_layers is None:
        extra = [n for n in ckpt.names() if n not in used and not _benign_extra(n, cfg)]
        if extra:
            log.warning("ignoring %d tensors the model does not use, e.g. %s", len(extra), extra[:3])
    return state


def _benign_extra(name: str, cfg: ModelConfig) -> bool:
    if name.endswith("rotary_emb.inv_freq") or (cfg.tie_word_embeddings and name == "lm_head.weight"):
        return True
    parts = name.split(".")
    # Layers past num_hidden_layers are MTP modules (DeepSeek layout): loaded by the MTP drafter.
    return len(parts) > 2 and parts[1] == "layers" and parts[2].isdigit() and int(parts[2]) >= cfg.num_hidden_layers
