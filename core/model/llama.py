"""Llama-family decoder (Llama, Mistral, Qwen2, Qwen3) in plain torch over the op table.

The same module code runs on every backend: attention, KV writes, RMSNorm,
RoPE and the lm-head matmul go through ``self.ops`` (an
:class:`hyspec.ops.OpTable`), so a backend swaps kernels without touching the
model.  q/k/v and gate/up projections are
stored fused (one matmul each); the loader concatenates the checkpoint's
separate tensors.

Two forward paths share the weights:

* :meth:`CausalLM.forward` -- the serving path over the paged KV cache
  (prefill chunks, decode and tree verification in one packed batch).
* :meth:`CausalLM.forward_dense` -- cache-free causal attention over
  ``[batch, seq]`` for training drafters and teacher forcing.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from hyspec.errors import CheckpointError
from hyspec.model.config import ModelConfig
from hyspec.model.rope import cos_sin_cache
from hyspec.ops import AttentionMetadata, OpTable, reference_ops
from hyspec.ops.attention import dense_causal_attention


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, sliding_window: int | None = None):
        super().__init__()
        self.sliding_window = sliding_window  # positions back a query reaches; None: full causal
        self.num_heads = cfg.num_attention_heads
        self.num_kv_heads = cfg.num_key_value_heads
        self.head_dim = cfg.head_dim
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        self.scale = self.head_dim ** -0.5
        self.qkv_proj = nn.Linear(cfg.hidden_size, self.q_size + 2 * self.kv_size, bias=cfg.qkv_bias)
        self.o_proj = nn.Linear(self.q_size, cfg.hidden_size, bias=cfg.o_bias)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)
        else:
            self.q_norm = self.k_norm = None

    def project(self, ops: OpTable, x: torch.Tensor, positions: torch.Tensor, cos_sin: torch.Tensor):
        """q [T, Hq, D], k [T, Hkv, D], v [T, Hkv, D] for tokens ``x [T, H]`` at ``positions [T]``."""
        T = x.shape[0]
        q, k, v = self.qkv_proj(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(T, self.num_heads, self.head_dim)
        k = k.view(T, self.num_kv_heads, self.head_dim)
        v = v.view(T, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.norm_qk(ops, q, k)
        q, k = ops.rotary(q, k, positions, cos_sin)
        return q, k, v

    def norm_qk(self, ops: OpTable, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-head q / k norms (Qwen3; Gemma 3 overrides it for its ``1 + w`` weights)."""
        return ops.rms_norm(q, self.q_norm.weight, self.q_norm.eps), ops.rms_norm(k, self.k_norm.weight, self.k_norm.eps)

    def forward(self, ops: OpTable, x: torch.Tensor, positions: torch.Tensor, cos_sin: torch.Tensor,
                kv: tuple[torch.Tensor, torch.Tensor], meta: AttentionMetadata) -> torch.Tensor:
        q, k, v = self.project(ops, x, positions, cos_sin)
        k_cache, v_cache = kv
        ops.write_kv(k, v, k_cache, v_cache, meta.slot_mapping)
        if self.sliding_window is None:
            out = ops.attention(q, k_cache, v_cache, meta, self.scale)  # [T, Hq, D]
        else:
            out = ops.attention(q, k_cache, v_cache, meta, self.scale, sliding_window=self.sliding_window)
        return self.o_proj(out.reshape(x.shape[0], self.q_size))

    def forward_dense(self, ops: OpTable, x: torch.Tensor, cos_sin: torch.Tensor) -> torch.Tensor:
        B, S, H = x.shape
        positions = torch.arange(S, device=x.device).repeat(B)
        q, k, v = self.project(ops, x.reshape(B * S, H), positions, cos_sin)
        out = dense_causal_attention(q.view(B, S, *q.shape[1:]), k.view(B, S, *k.shape[1:]),
                                     v.view(B, S, *v.shape[1:]), self.scale, self.sliding_window)
        return self.o_proj(out.reshape(B, S, self.q_size))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.intermediate_size = cfg.intermediate_size
        self.gate_up_proj = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=cfg.mlp_bias)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=cfg.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).split(self.intermediate_size, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, sliding_window: int | None = None):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg, sliding_window)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, ops: OpTable, h: torch.Tensor, residual: torch.Tensor | None, attend) -> tuple[torch.Tensor, torch.Tensor]:
        """One block on the (h, residual) pair; the residual stream after it is ``h + residual``.

        ``attend(normed) -> attention output`` hides whether the paged or the dense path runs.
        """
        norm = self.input_layernorm
        if residual is None:
            residual = h
            h = ops.rms_norm(h, norm.weight, norm.eps)
        else:
            h, residual = ops.rms_norm(h, norm.weight, norm.eps, residual)
        h = attend(h)
        norm = self.post_attention_layernorm
        h, residual = ops.rms_norm(h, norm.weight, norm.eps, residual)
        return self.mlp(h), residual


@dataclass
class ModelOutput:
    hidden: torch.Tensor  # [T, H] after the final norm: what lm_head sees
    aux_hidden: dict[int, torch.Tensor]  # layer index -> [T, H] residual stream after that layer


class CausalLM(nn.Module):
    """A decoder-only causal LM of the Llama family."""

    #: its lm_head's weight is read by ``lm_head_weight`` (the ``logits`` op), so a drafter's weight-only
    #: quantization (hyspec.model.quantize_drafter) leaves that linear as it is
    keep_dense_linears = ("lm_head",)

    def __init__(self, cfg: ModelConfig, ops: OpTable | None = None, max_positions: int | None = None):
        super().__init__()
        self.config = cfg
        self.ops = ops or reference_ops()
        self.max_positions = max_positions or cfg.max_position_embeddings
        windows = [cfg.sliding_window(i, self.max_positions) for i in range(cfg.num_hidden_layers)]
        _check_sliding_window_support(cfg, windows, self.ops)
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, w) for w in windows)
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = None if cfg.tie_word_embeddings else nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.register_buffer("cos_sin", cos_sin_cache(cfg, self.max_positions), persistent=False)
        #: set by a backend that runs the decoder layers of :meth:`forward` in one call (the CPU backend over
        #: GGUF blocks: hyspec.cpu_ops.decoder_stack, whose run_aux also returns the aux layers' states); None: the
        #: layer loop over the op table
        self.layer_stack = None

    @property
    def lm_head_weight(self) -> torch.Tensor:  # [V, H]
        return self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(input_ids)

    def forward(
        self,
        input_ids: torch.Tensor,  # [T]
        positions: torch.Tensor,  # [T]
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],  # per layer (k_cache, v_cache)
        meta: AttentionMetadata,
        aux_layers: tuple[int, ...] = (),
        inputs_embeds: torch.Tensor | None = None,  # [T, H], replaces the embedding lookup
    ) -> ModelOutput:
        ops = self.ops
        if meta.static_bounds is not None:  # a captured step: the bound was checked once, no host read here
            if meta.static_bounds[1] > self.max_positions:
                raise ValueError(f"static bound {meta.static_bounds[1]} exceeds the RoPE table ({self.max_positions})")
        elif positions.numel() and int(positions.max()) >= self.max_positions:
            raise ValueError(f"position {int(positions.max())} exceeds the RoPE table ({self.max_positions})")
        h = self.embed(input_ids) if inputs_embeds is None else inputs_embeds
        residual = None
        aux: dict[int, torch.Tensor] = {}
        stack = self.layer_stack
        if stack is not None and stack.accepts(h, kv_caches):
            # the backend runs every layer in one call, the aux layers' hidden states captured on the way; its
            # residual stream stays fp32 inside and takes the model's dtype at the end
            dtype = h.dtype
            wanted = tuple(i for i in aux_layers if 0 <= i < len(self.layers))
            h, residual, captured = stack.run_aux(h, residual, 0, len(self.layers), positions, kv_caches, meta,
                                                  wanted)
            aux = {i: captured[i].to(dtype) for i in aux_layers if i in captured}
            h, residual = h.to(dtype), residual.to(dtype)
        else:
            for i, layer in enumerate(self.layers):
                attn = layer.self_attn
                h, residual = layer(ops, h, residual,
                                    lambda x, attn=attn, kv=kv_caches[i], cs=self.layer_cos_sin(i):
                                    attn(ops, x, positions, cs, kv, meta))
                if i in aux_layers:
                    aux[i] = h + residual
        return ModelOutput(hidden=self.final_norm(h, residual), aux_hidden=aux)

    def forward_dense(
        self,
        input_ids: torch.Tensor,  # [B, S]
        aux_layers: tuple[int, ...] = (),
    ) -> ModelOutput:  # hidden [B, S, H]
        """Cache-free causal forward over whole sequences (positions 0..S-1)."""
        ops = self.ops
        h = self.embed(input_ids)
        residual = None
        aux: dict[int, torch.Tensor] = {}
        for i, layer in enumerate(self.layers):
            attn = layer.self_attn
            h, residual = layer(ops, h, residual,
                                lambda x, attn=attn, cs=self.layer_cos_sin(i): attn.forward_dense(ops, x, cs))
            if i in aux_layers:
                aux[i] = h + residual
        return ModelOutput(hidden=self.final_norm(h, residual), aux_hidden=aux)

    def final_norm(self, h: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """The last residual add and norm: what lm_head sees (Gemma overrides it for its ``1 + w`` weight)."""
        return self.ops.rms_norm(h, self.norm.weight, self.norm.eps, residual)[0]

    def layer_cos_sin(self, layer: int) -> torch.Tensor:
        """The RoPE table layer ``layer`` rotates with (one for all layers here; Gemma 3's local layers have
        their own, hyspec.model.gemma)."""
        return self.cos_sin

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """``[N, H] -> [N, V]`` fp32 logits: the op table's ``logits`` (the matmul runs in the model dtype)."""
        return self.ops.logits(hidden, self.lm_head_weight)


def _check_sliding_window_support(cfg: ModelConfig, windows: list[int | None], ops: OpTable) -> None:
    """A windowed model on an attention op that would attend to everything is refused, naming both."""
    windowed = [i for i, w in enumerate(windows) if w is not None]
    if windowed and not getattr(ops.attention, "supports_sliding_window", False):
        raise CheckpointError(
            f"this {cfg.model_type} model uses sliding-window attention (window {windows[windowed[0]]} on "
            f"{len(windowed)} of {len(windows)} layers), which the {ops.sources.get('attention', '?')!r} attention "
            "op of this backend does not implement; run it on the cpu backend (or the reference ops), or with a "
            "max_model_len short enough that no position reaches past the window")
