"""Gemma 2 and Gemma 3 (text) decoders over the op table, as transformers' ``modeling_gemma2.py`` /
``modeling_gemma3.py`` compute them.

What differs from the Llama family (hyspec.model.llama), and where it lives here:

* RMSNorm multiplies by ``1 + w``: the loader folds the ``+ 1`` into the stored weight
  (hyspec.model.loader, as llama.cpp's converter does for its GGUFs) and keeps it in fp32
  whatever the model dtype, and :func:`gemma_rms_norm` multiplies in fp32 and rounds once, as
  transformers' ``Gemma2RMSNorm`` / ``Gemma3RMSNorm`` do.  The Llama-family norm instead rounds
  the normed activations to the model dtype before the weight multiplies them; rounding twice,
  and ``1 + w`` rounded to bf16, put a bf16 Gemma 3 at 1.21x the 4-ulp bound of
  tests/model/test_numerics_vs_transformers.py where transformers sits at 0.85x (measured in
  docs/results/2026-12-06/architectures).  An fp32 model runs the op table's ``rms_norm`` unchanged.
* Four norms a layer: after attention and around the MLP (``post_attention_layernorm``,
  ``pre_feedforward_layernorm``, ``post_feedforward_layernorm``).
* Embeddings scaled by ``sqrt(hidden_size)`` (in the activation dtype); GeGLU MLP
  (``gelu_pytorch_tanh``); attention scale ``query_pre_attn_scalar ** -0.5``.
* Gemma 2: attention scores and final logits soft-capped (``c * tanh(x / c)``).  The
  attention op must honour ``softcap`` (``supports_softcap``); a table whose op does not is
  refused by name.  The final cap is applied in :meth:`GemmaCausalLM.compute_logits`, which
  every target-logits path goes through.
* Gemma 3: per-head q/k norms (``1 + w`` too) and a second RoPE table for the sliding layers
  (``rope_local_base_freq``, no scaling), chosen per layer by :meth:`layer_cos_sin`.
* Alternating sliding-window / full layers come from ``ModelConfig.layer_windows``.
"""
from __future__ import annotations

from dataclasses import replace

import torch
import torch.nn.functional as F
from torch import nn

from hyspec.errors import CheckpointError
from hyspec.model.config import ModelConfig
from hyspec.model.llama import MLP, Attention, CausalLM, RMSNorm, _check_sliding_window_support
from hyspec.model.rope import cos_sin_cache
from hyspec.ops import AttentionMetadata, OpTable, reference_ops
from hyspec.ops.attention import dense_causal_attention


def local_cos_sin_cache(cfg: ModelConfig, max_positions: int) -> torch.Tensor | None:
    """Gemma 3's sliding layers' RoPE table; None where every layer shares the global one."""
    if cfg.local_rope is None:
        return None
    return cos_sin_cache(replace(cfg, rope=cfg.local_rope), max_positions)


def gemma_rms_norm(ops: OpTable, x: torch.Tensor, norm: RMSNorm,
                   residual: torch.Tensor | None = None) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """``ops.rms_norm`` for a norm whose weight (``1 + w``) is kept in fp32 over bf16 / fp16 activations:
    the residual add in the activation dtype, then the norm and the weight product in fp32, rounded once."""
    if norm.weight.dtype == x.dtype:  # an fp32 model: the op table's fused norm as it is
        return ops.rms_norm(x, norm.weight, norm.eps, residual)
    if residual is not None:
        x = x + residual
    out = ops.rms_norm(x.float(), norm.weight, norm.eps).to(x.dtype)
    return out if residual is None else (out, x)


class GemmaAttention(Attention):
    def __init__(self, cfg: ModelConfig, sliding_window: int | None = None):
        super().__init__(cfg, sliding_window)
        if cfg.query_pre_attn_scalar is not None:
            self.scale = cfg.query_pre_attn_scalar ** -0.5
        self.softcap = cfg.attn_logit_softcapping

    def norm_qk(self, ops: OpTable, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return gemma_rms_norm(ops, q, self.q_norm), gemma_rms_norm(ops, k, self.k_norm)

    def _attention_kwargs(self) -> dict:
        kwargs = {}
        if self.sliding_window is not None:
            kwargs["sliding_window"] = self.sliding_window
        if self.softcap is not None:
            kwargs["softcap"] = self.softcap
        return kwargs

    def forward(self, ops: OpTable, x: torch.Tensor, positions: torch.Tensor, cos_sin: torch.Tensor,
                kv: tuple[torch.Tensor, torch.Tensor], meta: AttentionMetadata) -> torch.Tensor:
        q, k, v = self.project(ops, x, positions, cos_sin)
        k_cache, v_cache = kv
        ops.write_kv(k, v, k_cache, v_cache, meta.slot_mapping)
        out = ops.attention(q, k_cache, v_cache, meta, self.scale, **self._attention_kwargs())
        return self.o_proj(out.reshape(x.shape[0], self.q_size))

    def forward_dense(self, ops: OpTable, x: torch.Tensor, cos_sin: torch.Tensor) -> torch.Tensor:
        B, S, H = x.shape
        positions = torch.arange(S, device=x.device).repeat(B)
        q, k, v = self.project(ops, x.reshape(B * S, H), positions, cos_sin)
        out = dense_causal_attention(q.view(B, S, *q.shape[1:]), k.view(B, S, *k.shape[1:]),
                                     v.view(B, S, *v.shape[1:]), self.scale, self.sliding_window, self.softcap)
        return self.o_proj(out.reshape(B, S, self.q_size))


class GeGLUMLP(MLP):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).split(self.intermediate_size, dim=-1)
        return self.down_proj(F.gelu(gate, approximate="tanh") * up)


class GemmaDecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, sliding_window: int | None = None):
        super().__init__()
        H, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.input_layernorm = RMSNorm(H, eps)
        self.self_attn = GemmaAttention(cfg, sliding_window)
        self.post_attention_layernorm = RMSNorm(H, eps)
        self.pre_feedforward_layernorm = RMSNorm(H, eps)
        self.mlp = GeGLUMLP(cfg)
        self.post_feedforward_layernorm = RMSNorm(H, eps)

    def forward(self, ops: OpTable, h: torch.Tensor, residual: torch.Tensor | None,
                attend) -> tuple[torch.Tensor, torch.Tensor]:
        """One block on the (h, residual) pair, as hyspec.model.llama.DecoderLayer: the residual stream after it
        is ``h + residual``.  Attention's and the MLP's outputs are normed before they join the stream."""
        if residual is None:
            residual = h
            h = gemma_rms_norm(ops, h, self.input_layernorm)
        else:
            h, residual = gemma_rms_norm(ops, h, self.input_layernorm, residual)
        h = gemma_rms_norm(ops, attend(h), self.post_attention_layernorm)
        h, residual = gemma_rms_norm(ops, h, self.pre_feedforward_layernorm, residual)
        h = gemma_rms_norm(ops, self.mlp(h), self.post_feedforward_layernorm)
        return h, residual


class GemmaCausalLM(CausalLM):
    """Gemma 2 / Gemma 3 text decoder; the forward passes are :class:`CausalLM`'s over Gemma's layers."""

    def __init__(self, cfg: ModelConfig, ops: OpTable | None = None, max_positions: int | None = None):
        nn.Module.__init__(self)
        self.config = cfg
        self.ops = ops or reference_ops()
        self.max_positions = max_positions or cfg.max_position_embeddings
        windows = [cfg.sliding_window(i, self.max_positions) for i in range(cfg.num_hidden_layers)]
        _check_sliding_window_support(cfg, windows, self.ops)
        _check_softcap_support(cfg, self.ops)
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(GemmaDecoderLayer(cfg, w) for w in windows)
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = None if cfg.tie_word_embeddings else nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.register_buffer("cos_sin", cos_sin_cache(cfg, self.max_positions), persistent=False)
        local = local_cos_sin_cache(cfg, self.max_positions)
        self.register_buffer("cos_sin_local", local, persistent=False)
        # which layers rotate with the local table: Gemma 3's sliding-window layers (by config, whether or not
        # max_positions lets the window cut anything)
        self._local_layers = frozenset(i for i, w in enumerate(cfg.layer_windows) if w is not None) \
            if local is not None else frozenset()
        self.layer_stack = None  # the CPU decoder stack runs Llama-family layers only (hyspec.cpu_ops.decoder_stack)

    def layer_cos_sin(self, layer: int) -> torch.Tensor:
        return self.cos_sin_local if layer in self._local_layers else self.cos_sin

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        h = self.embed_tokens(input_ids)
        return h * torch.tensor(self.config.hidden_size ** 0.5, dtype=h.dtype)

    def final_norm(self, h: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return gemma_rms_norm(self.ops, h, self.norm, residual)[0]

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = super().compute_logits(hidden)
        cap = self.config.final_logit_softcapping
        if cap is not None:
            logits = torch.tanh(logits / cap) * cap
        return logits


def _check_softcap_support(cfg: ModelConfig, ops: OpTable) -> None:
    """Soft-capped attention on an op that would skip the cap is refused, naming both."""
    if cfg.attn_logit_softcapping is not None and not getattr(ops.attention, "supports_softcap", False):
        raise CheckpointError(
            f"this {cfg.model_type} model soft-caps its attention scores (attn_logit_softcapping "
            f"{cfg.attn_logit_softcapping}), which the {ops.sources.get('attention', '?')!r} attention op of this "
            "backend does not implement; run it on the reference ops")
