"""DFlash: a block-parallel drafter conditioned on the target's hidden states.

One forward drafts a whole block.  The block is ``[t[n], MASK, ..., MASK]``
at positions ``n .. n+K`` (``t[n]`` = the root, the last committed token;
``MASK`` = a learned embedding) and slot ``j`` predicts ``t[n+j]``.  Its
layers attend *non-causally* within the block and to a context: the target's
residual streams after ``target_layers``, concatenated per committed token,
projected to H (``hidden_norm(fc(.))``) and turned into extra keys/values by
each draft layer's own k/v projections (RoPE at the token's position).  The
context covers positions ``< n`` (the root has no target hidden state yet),
exactly as in training.  Embeddings and lm_head are the target's.

This follows the DFlash paper (Chen, Liang, Liu, "DFlash: Block Diffusion for
Flash Speculative Decoding", arXiv 2602.06036; KV injection of fused
multi-layer target features) and the layout of SpecForge's reference drafter
(``fc`` + ``hidden_norm`` over the concatenated layers, shared k/v projections
for context and block), on hyspec's Llama-family decoder layers.

Serving runs the layers over the paged pool (the context K/V is cached per
sequence, the block written after it and dropped after drafting); training
runs the same maths densely over many blocks at once (:meth:`forward_train`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from hyspec.drafters.lm_head import TargetHeadDrafter
from hyspec.errors import CheckpointError
from hyspec.model.config import ModelConfig
from hyspec.model.llama import Attention, DecoderLayer, RMSNorm
from hyspec.model.rope import cos_sin_cache
from hyspec.ops import AttentionMetadata, OpTable


@dataclass(frozen=True)
class DFlashConfig:
    layers: ModelConfig  # the draft decoder layers (num_hidden_layers = their count; hidden/vocab = the target's)
    target_layers: tuple[int, ...]  # target layers whose residual streams form the context, in order
    block_size: int  # K: mask slots per block = the longest draft

    def __post_init__(self) -> None:
        if not self.target_layers:
            raise CheckpointError("a DFlash drafter needs at least one target layer for its context")
        if self.block_size < 1:
            raise CheckpointError(f"DFlash block_size must be >= 1, got {self.block_size}")

    def check_target(self, target: ModelConfig, where: str) -> None:
        for key in ("hidden_size", "vocab_size"):
            mine, theirs = getattr(self.layers, key), getattr(target, key)
            if mine != theirs:
                raise CheckpointError(f"the drafter in {where} was trained for another target: its {key} is {mine}, "
                                      f"the target's is {theirs}")
        bad = [layer for layer in self.target_layers if not 0 <= layer < target.num_hidden_layers]
        if bad:
            raise CheckpointError(f"the drafter in {where} reads target layers {bad}, but the target has "
                                  f"{target.num_hidden_layers} layers: it was trained for another target")


def default_target_layers(num_layers: int, count: int = 3) -> tuple[int, ...]:
    """``count`` layers spread from shallow to deep (as DFlash/EAGLE-3 pick low/mid/high features)."""
    if num_layers <= count:
        return tuple(range(num_layers))
    low, high = 1, num_layers - 2
    return tuple(sorted({round(low + i * (high - low) / (count - 1)) for i in range(count)}))


class DFlashDrafter(TargetHeadDrafter):
    def __init__(self, config: DFlashConfig, embed_weight: torch.Tensor, lm_head_weight: torch.Tensor,
                 ops: OpTable | None = None, max_positions: int | None = None):
        cfg = config.layers
        H = cfg.hidden_size
        if embed_weight.shape != (cfg.vocab_size, H) or lm_head_weight.shape != (cfg.vocab_size, H):
            raise CheckpointError(f"{type(self).__name__}: the target's embedding/lm_head are "
                                  f"{tuple(embed_weight.shape)}/{tuple(lm_head_weight.shape)}, the drafter expects "
                                  f"({cfg.vocab_size}, {H})")
        super().__init__(embed_weight, lm_head_weight, ops)  # the target's, not trained or saved
        self.config = config
        self.fc = nn.Linear(len(config.target_layers) * H, H, bias=False)
        self.hidden_norm = RMSNorm(H, cfg.rms_norm_eps)
        self.mask_embedding = nn.Parameter(torch.randn(H) * 0.02)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(H, cfg.rms_norm_eps)
        self.max_positions = max_positions or cfg.max_position_embeddings
        self.register_buffer("cos_sin", cos_sin_cache(cfg, self.max_positions), persistent=False)

    @property
    def block_size(self) -> int:
        return self.config.block_size

    # -- pieces shared by both paths ------------------------------------------------------------

    def context(self, aux: torch.Tensor) -> torch.Tensor:  # [..., len(target_layers) * H] -> [..., H]
        """The fused context feature of committed tokens (one row per token)."""
        h = self.fc(aux.to(self.hidden_norm.weight.dtype))  # fc may be a quantized drop-in without .weight
        return self.ops.rms_norm(h, self.hidden_norm.weight, self.hidden_norm.eps)

    def context_kv(self, index: int, feats: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer ``index``'s keys and values ``[T, Hkv, D]`` of context rows ``feats [T, H]`` at ``positions [T]``."""
        attn: Attention = self.layers[index].self_attn
        dense = getattr(attn.qkv_proj, "weight", None)
        if dense is not None:  # the K and V rows only: context rows need no queries
            b = None if attn.qkv_proj.bias is None else attn.qkv_proj.bias[attn.q_size:]
            kv = F.linear(feats, dense[attn.q_size:], b)
        else:  # a quantized drop-in (speculative_config.quantization): its rows come whole
            kv = attn.qkv_proj(feats)[..., attn.q_size:]
        k, v = kv.split([attn.kv_size, attn.kv_size], dim=-1)
        k = k.view(-1, attn.num_kv_heads, attn.head_dim)
        v = v.view(-1, attn.num_kv_heads, attn.head_dim)
        if attn.k_norm is not None:
            k = self.ops.rms_norm(k, attn.k_norm.weight, attn.k_norm.eps)
        _, k = self.ops.rotary(k, k, positions, self.cos_sin)
        return k, v

    def block_embeddings(self, input_ids: torch.Tensor, is_mask: torch.Tensor) -> torch.Tensor:
        """Root slots embed their token, mask slots take the learned mask embedding. ``[...] -> [..., H]``."""
        emb = self.embed_target(input_ids, self.mask_embedding)
        return torch.where(is_mask[..., None], self.mask_embedding.to(emb.dtype), emb)

    def _layers(self, x: torch.Tensor, attend: Callable[[int, Attention, torch.Tensor], torch.Tensor]) -> torch.Tensor:
        residual = None
        for i, layer in enumerate(self.layers):
            x, residual = layer(self.ops, x, residual, lambda h, i=i, a=layer.self_attn: attend(i, a, h))
        h, _ = self.ops.rms_norm(x, self.norm.weight, self.norm.eps, residual)
        return h  # after the final norm: what lm_head sees

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:  # [..., H] -> [..., V] fp32
        return self.head_logits(hidden)

    # -- serving: the paged pool -----------------------------------------------------------------

    def forward_paged(
        self,
        input_ids: torch.Tensor,  # [T] packed blocks (mask slots' ids are ignored)
        is_mask: torch.Tensor,  # [T] bool
        positions: torch.Tensor,  # [T]
        caches: tuple[tuple[torch.Tensor, torch.Tensor], ...],  # per draft layer (k_cache, v_cache), context written
        meta: AttentionMetadata,  # blocks after their context, an all-true tree mask per block
    ) -> torch.Tensor:  # [T, H] after the final norm
        x = self.block_embeddings(input_ids, is_mask)
        return self._layers(x, lambda i, attn, h: attn(self.ops, h, positions, self.cos_sin, caches[i], meta))

    # -- training: dense blocks ------------------------------------------------------------------

    def forward_train(
        self,
        context: torch.Tensor,  # [B, S, H] fused context feature of every position
        roots: torch.Tensor,  # [B, N] int64 root token of each block
        anchors: torch.Tensor,  # [B, N] int64 position of each root (block b,i sees context < anchors[b,i])
    ) -> torch.Tensor:  # [B, N, K+1, H] after the final norm
        B, S, H = context.shape
        N, K1 = anchors.shape[1], self.block_size + 1
        slot = torch.arange(K1, device=anchors.device)
        pos_q = (anchors[..., None] + slot).reshape(B, N * K1)
        if int(pos_q.max()) >= self.max_positions:
            raise ValueError(f"DFlash training position {int(pos_q.max())} exceeds the RoPE table "
                             f"({self.max_positions})")
        is_mask = (slot > 0).expand(B, N, K1)
        x = self.block_embeddings(roots[..., None].expand(B, N, K1), is_mask).reshape(B, N * K1, H)
        # [B, 1, Q, S + Q]: context strictly before the block's root, and the block itself (both directions).
        sees_ctx = torch.arange(S, device=anchors.device) < anchors.repeat_interleave(K1, dim=1)[..., None]
        block_id = torch.arange(N, device=anchors.device).repeat_interleave(K1)
        sees_block = (block_id[:, None] == block_id[None, :]).expand(B, N * K1, N * K1)
        mask = torch.cat([sees_ctx, sees_block], dim=-1)[:, None]
        ctx_pos = torch.arange(S, device=anchors.device)
        ctx_kv = [self.context_kv(i, context.reshape(B * S, H), ctx_pos.repeat(B)) for i in range(len(self.layers))]

        def attend(i: int, attn: Attention, h: torch.Tensor) -> torch.Tensor:
            Q = h.shape[1]
            q, k, v = attn.project(self.ops, h.reshape(B * Q, H), pos_q.reshape(-1), self.cos_sin)
            ck, cv = ctx_kv[i]
            keys = torch.cat([ck.view(B, S, *ck.shape[1:]), k.view(B, Q, *k.shape[1:])], dim=1)
            values = torch.cat([cv.view(B, S, *cv.shape[1:]), v.view(B, Q, *v.shape[1:])], dim=1)
            out = F.scaled_dot_product_attention(
                q.view(B, Q, *q.shape[1:]).transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2),
                attn_mask=mask, scale=attn.scale, enable_gqa=attn.num_heads != attn.num_kv_heads)
            return attn.o_proj(out.transpose(1, 2).reshape(B, Q, attn.q_size))

        return self._layers(x, attend).view(B, N, K1, H)
