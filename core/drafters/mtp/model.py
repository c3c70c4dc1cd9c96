"""DeepSeek-V3-style multi-token-prediction (MTP) modules.

Module ``m`` (0-based) at position ``j`` combines two rows::

    x = eh_proj(cat([enorm(embed(t[j + m + 1])), hnorm(H_m[j])]))   # 2H -> H, embedding FIRST
    H_{m+1}[j] = block(x)                                            # one decoder layer, its own causal KV
    logits     = lm_head(shared_head.norm(H_{m+1}[j]))               # predicts t[j + m + 2]

``H_0`` is the target's hidden state *after* its final norm -- what vLLM's
``DeepSeekMTP`` receives (``DeepseekV2Model.forward`` returns
``self.norm(hidden, residual)``) -- and ``H_{m+1}`` is the module's residual
stream before its own ``shared_head.norm``, which is what the next module
consumes.  The embedding table and lm_head are the target's (DeepSeek trains
them shared; the checkpoint's per-module ``embed_tokens`` /
``shared_head.head`` are copies), the ``shared_head.norm`` is per module.
Like vLLM, the embedding of the entry at position 0 is zeroed.

The block is a Llama-family :class:`~hyspec.model.llama.DecoderLayer` (the
architecture of the target's layers), run over the paged KV pool for serving
and densely for training.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from hyspec.drafters.lm_head import TargetHeadDrafter
from hyspec.errors import CheckpointError
from hyspec.model.config import ModelConfig
from hyspec.model.llama import DecoderLayer, RMSNorm
from hyspec.model.rope import cos_sin_cache
from hyspec.ops import AttentionMetadata, OpTable


@dataclass(frozen=True)
class MTPConfig:
    block: ModelConfig  # architecture of every module's transformer block; hidden/vocab = the target's
    num_modules: int  # trained modules; deeper drafts reuse the last one

    def __post_init__(self) -> None:
        if self.num_modules < 1:
            raise CheckpointError(f"an MTP drafter needs at least one module, got num_modules={self.num_modules}")


class MTPLayer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        h, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.enorm = RMSNorm(h, eps)
        self.hnorm = RMSNorm(h, eps)
        self.eh_proj = nn.Linear(2 * h, h, bias=False)
        self.block = DecoderLayer(cfg)
        self.head_norm = RMSNorm(h, eps)  # DeepSeek's shared_head.norm


class MTPDrafter(TargetHeadDrafter):
    """``num_modules`` MTP layers over the target's embedding and lm_head (held, not owned)."""

    def __init__(self, config: MTPConfig, embed_weight: torch.Tensor, lm_head_weight: torch.Tensor,
                 ops: OpTable | None = None, max_positions: int | None = None):
        cfg = config.block
        if embed_weight.shape != (cfg.vocab_size, cfg.hidden_size):
            raise CheckpointError(f"MTP drafter: the target's embedding is {tuple(embed_weight.shape)}, the drafter "
                                  f"expects ({cfg.vocab_size}, {cfg.hidden_size}) (vocab_size, hidden_size)")
        if lm_head_weight.shape != embed_weight.shape:
            raise CheckpointError(f"MTP drafter: the target's lm_head is {tuple(lm_head_weight.shape)}, "
                                  f"expected {tuple(embed_weight.shape)}")
        super().__init__(embed_weight, lm_head_weight, ops)
        self.config = config
        self.layers = nn.ModuleList(MTPLayer(cfg) for _ in range(config.num_modules))
        self.max_positions = max_positions or cfg.max_position_embeddings
        self.register_buffer("cos_sin", cos_sin_cache(cfg, self.max_positions), persistent=False)

    @property
    def num_modules(self) -> int:
        return self.config.num_modules

    def _combine(self, m: int, input_ids: torch.Tensor, hidden: torch.Tensor, is_first: torch.Tensor) -> torch.Tensor:
        layer, ops = self.layers[m], self.ops
        w = layer.enorm.weight  # the drafter's dtype (eh_proj may be a quantized drop-in without .weight)
        emb = self.embed_target(input_ids, w)
        emb = emb.masked_fill(is_first[..., None], 0.0)
        e = ops.rms_norm(emb, layer.enorm.weight, layer.enorm.eps)
        h = ops.rms_norm(hidden.to(w.dtype), layer.hnorm.weight, layer.hnorm.eps)
        return layer.eh_proj(torch.cat([e, h], dim=-1))

    def _block(self, m: int, x: torch.Tensor, attend: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        h, residual = self.layers[m].block(self.ops, x, None, attend)
        return h + residual  # the module's output hidden state (before shared_head.norm)

    def forward_paged(
        self,
        m: int,
        input_ids: torch.Tensor,  # [T] token t[j + m + 1] of each entry
        hidden: torch.Tensor,  # [T, H] H_m[j]
        positions: torch.Tensor,  # [T] j
        kv: tuple[torch.Tensor, torch.Tensor],  # module m's (k_cache, v_cache)
        meta: AttentionMetadata,
    ) -> torch.Tensor:  # [T, H] H_{m+1}
        attn = self.layers[m].block.self_attn
        x = self._combine(m, input_ids, hidden, positions == 0)
        return self._block(m, x, lambda h: attn(self.ops, h, positions, self.cos_sin, kv, meta))

    def forward_dense(
        self,
        m: int,
        input_ids: torch.Tensor,  # [B, S] token t[j + m + 1] for entries j = 0..S-1
        hidden: torch.Tensor,  # [B, S, H] H_m[j]
    ) -> torch.Tensor:  # [B, S, H] H_{m+1}, causal over the S entries
        B, S = input_ids.shape
        if S > self.max_positions:
            raise ValueError(f"MTP training sequence of {S} positions exceeds the RoPE table ({self.max_positions})")
        attn = self.layers[m].block.self_attn
        is_first = torch.zeros(B, S, dtype=torch.bool, device=input_ids.device)
        is_first[:, 0] = True
        x = self._combine(m, input_ids, hidden, is_first)
        return self._block(m, x, lambda h: attn.forward_dense(self.ops, h, self.cos_sin))

    def logits(self, m: int, out: torch.Tensor) -> torch.Tensor:  # [..., H] -> [..., V] fp32
        norm = self.layers[m].head_norm
        h = self.ops.rms_norm(out, norm.weight, norm.eps)
        return self.head_logits(h)
