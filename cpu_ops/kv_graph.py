"""A hyspec ``CausalLM`` with its KV cache as explicit inputs and outputs: the graph that is exported to ONNX.

The serving path (``CausalLM.forward``) writes into a paged pool through the
op table; ONNX Runtime has no such pool, so the exported graph takes the
cache as tensors and returns the grown cache.  The maths is the model's own
(same weights, same RMSNorm and residual order, same RoPE table, fp32
softmax), written with plain tensor ops so that it traces to a static graph
with dynamic batch, new-token and past lengths:

    inputs   input_ids       [B, S]          int64  new tokens (rows may be right-padded)
             position_ids    [B, S]          int64  RoPE position of each new token
             attention_mask  [B, P + S]      int64  1 = a live cache entry / real new token, 0 = hole or padding
             logits_index    [B]             int64  which new token's logits to return (0 <= i < S)
             past_key_<l>    [B, Hkv, P, D]  fp32   per layer l, P may be 0
             past_value_<l>  [B, Hkv, P, D]  fp32
    outputs  logits          [B, V]          fp32   next-token logits after input_ids[b, logits_index[b]]
             present_key_<l> [B, Hkv, P + S, D]     the past with the new tokens' keys appended
             present_value_<l>

New token ``i`` of a row sees every live past entry and the live new tokens
``<= i`` (causal).  Masked scores are set to the fp32 minimum, not -inf, so a
padded query row can never become NaN; its output is never read.
"""
from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn

from hyspec.model.llama import CausalLM
from hyspec.ops.norm import rms_norm


def graph_io_names(num_layers: int) -> tuple[list[str], list[str]]:
    """(input names, output names) of the exported graph, in call order."""
    past = [f"past_{kind}_{layer}" for layer in range(num_layers) for kind in ("key", "value")]
    present = [f"present_{kind}_{layer}" for layer in range(num_layers) for kind in ("key", "value")]
    return ["input_ids", "position_ids", "attention_mask", "logits_index", *past], ["logits", *present]


class KVCacheLM(nn.Module):
    """An fp32 copy of ``model`` whose forward takes and returns the KV cache (see the module docstring)."""

    def __init__(self, model: CausalLM):
        super().__init__()
        windowed = [i for i, layer in enumerate(model.layers) if getattr(layer.self_attn, "sliding_window", None)]
        if windowed:  # the exported graph attends to its whole cache
            raise ValueError(f"layers {windowed} use sliding-window attention, which the ONNX graph does not "
                             "implement; run this model through the op table instead")
        self.model = copy.deepcopy(model).float().eval().requires_grad_(False)
        cfg = self.model.config
        self.num_layers = cfg.num_hidden_layers
        self.num_heads = cfg.num_attention_heads
        self.num_kv_heads = cfg.num_key_value_heads
        self.head_dim = cfg.head_dim

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor, attention_mask: torch.Tensor,
                logits_index: torch.Tensor, *past: torch.Tensor) -> tuple[torch.Tensor, ...]:
        m = self.model
        B, S = input_ids.shape
        P = past[0].shape[2]
        # [S, P + S]: new token i may see cache column j iff j <= P + i (all of the past, causal among the new)
        causal = torch.arange(P + S, device=input_ids.device)[None, :] <= (P + torch.arange(S, device=input_ids.device))[:, None]
        visible = causal[None, None] & (attention_mask[:, None, None, :] != 0)  # [B, 1, S, P + S]
        cos, sin = self._cos_sin(position_ids)
        h = m.embed(input_ids)  # [B, S, H]
        residual = None
        present: list[torch.Tensor] = []
        for i, layer in enumerate(m.layers):
            norm = layer.input_layernorm
            if residual is None:
                residual = h
                h = rms_norm(h, norm.weight, norm.eps)
            else:
                h, residual = rms_norm(h, norm.weight, norm.eps, residual)
            h, k_all, v_all = self._attention(layer.self_attn, h, cos, sin, visible, past[2 * i], past[2 * i + 1])
            present += [k_all, v_all]
            norm = layer.post_attention_layernorm
            h, residual = rms_norm(h, norm.weight, norm.eps, residual)
            h = layer.mlp(h)
        h, _ = rms_norm(h, m.norm.weight, m.norm.eps, residual)
        index = logits_index[:, None, None].expand(B, 1, h.shape[-1])
        last = h.gather(1, index).squeeze(1)  # [B, H]
        return (F.linear(last, m.lm_head_weight).float(), *present)

    def _cos_sin(self, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``[B, S, 1, D]`` cos and sin for the positions, laid out as the reference rotary lays them out."""
        cs = F.embedding(position_ids, self.model.cos_sin)  # [B, S, D]: cos in the first half, sin in the second
        half = self.head_dim // 2
        cos = torch.cat([cs[..., :half], cs[..., :half]], dim=-1)[:, :, None, :]
        sin = torch.cat([cs[..., half:], cs[..., half:]], dim=-1)[:, :, None, :]
        return cos, sin

    def _attention(self, attn, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, visible: torch.Tensor,
                   past_k: torch.Tensor, past_v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        B, S, _ = x.shape
        Hq, Hkv, D = self.num_heads, self.num_kv_heads, self.head_dim
        q, k, v = attn.qkv_proj(x).split([attn.q_size, attn.kv_size, attn.kv_size], dim=-1)
        q, k, v = q.reshape(B, S, Hq, D), k.reshape(B, S, Hkv, D), v.reshape(B, S, Hkv, D)
        if attn.q_norm is not None:
            q = rms_norm(q, attn.q_norm.weight, attn.q_norm.eps)
            k = rms_norm(k, attn.k_norm.weight, attn.k_norm.eps)
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        k_all = torch.cat([past_k, k.transpose(1, 2)], dim=2)  # [B, Hkv, P + S, D]
        v_all = torch.cat([past_v, v.transpose(1, 2)], dim=2)
        group = Hq // Hkv
        # [B, Hkv, S*group... ]: fold the query heads of one KV head together instead of copying K and V
        qg = q.transpose(1, 2).reshape(B, Hkv, group * S, D)  # query head h = kv_head * group + g
        scores = torch.matmul(qg, k_all.transpose(2, 3)) * attn.scale  # [B, Hkv, group * S, P + S]
        scores = scores.reshape(B, Hkv * group, S, -1)
        scores = scores.masked_fill(~visible, torch.finfo(torch.float32).min)
        probs = torch.softmax(scores, dim=-1).reshape(B, Hkv, group * S, -1)
        out = torch.matmul(probs, v_all).reshape(B, Hq, S, D).transpose(1, 2)  # [B, S, Hq, D]
        return attn.o_proj(out.reshape(B, S, Hq * D)), k_all, v_all


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


__all__ = ["KVCacheLM", "graph_io_names"]
