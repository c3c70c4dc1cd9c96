"""EAGLE draft heads: EAGLE-1/2 and EAGLE-3, Llama decoder layers over the op table.

Names as in the papers: ``f_i`` is the target's feature of token ``t_i``; the
head reads *pairs* ``(f_i, t_{i+1})`` and its output at pair ``i`` stands for
``f_{i+1}``, so ``lm_head`` of it gives the distribution of ``t_{i+2}``.

* EAGLE-1/2 (Li et al. 2024, arXiv:2401.15077 / 2406.16858): ``x = fc([emb(t_{i+1}) ; f_i])``
  -- the embedding first, as SafeAILab's ``cnets.py`` concatenates
  ``(inputs_embeds, hidden_states)`` -- then one decoder layer whose
  ``input_layernorm`` is absent (EAGLE's first layer skips it), and the
  target's own ``lm_head`` on the output.  ``f`` is the target's hidden state
  after its final norm (what its lm_head sees).  Deeper drafts feed the head's
  own output back as ``f``.
* EAGLE-3 (Li et al. 2025, arXiv:2503.01840): ``f_i = fc([low ; mid ; high])``
  fuses three target layers (3H -> H); the layer's attention reads
  ``[input_layernorm(emb) ; hidden_norm(f)]`` (2H wide q/k/v) with ``f`` as the
  residual; the head has its own final ``norm`` and a reduced-vocabulary
  ``lm_head`` whose id ``d`` means target id ``d + d2t[d]``.  Drafting feeds the
  layer's output (before ``norm``) back as ``f`` for depth > 1 -- the
  "training-time test" the head was trained with.
* EAGLE-3 variants vLLM 0.32's ``llama_eagle3.py`` runs: ``num_hidden_layers > 1``
  -- the first layer as above, every later one a plain decoder layer
  (``input_layernorm``, H-wide q/k/v) on the residual stream alone, no embedding
  -- and heads without ``fc`` (``eagle_config.use_aux_hidden_state: false``),
  whose ``f`` is the target's last hidden state after its final norm (EAGLE-1's
  feature) instead of three fused layers.  The output fed back and normed into
  the logits is the last layer's residual stream.

The embeddings (and for EAGLE-1 the lm_head) are the target's, shared and never
saved.  The layer is :class:`hyspec.model.llama.DecoderLayer` and attends
through the op table's paged attention over the head's own KV in the shared
pool, with explicit positions and tree masks like the target.
"""
from __future__ import annotations

from abc import ABCMeta, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from hyspec.errors import CheckpointError
from hyspec.model.config import ModelConfig
from hyspec.model.llama import CausalLM, DecoderLayer, RMSNorm
from hyspec.model.rope import cos_sin_cache
from hyspec.ops import AttentionMetadata, OpTable

EAGLE, EAGLE3 = "eagle", "eagle3"
METHODS = (EAGLE, EAGLE3)


def default_aux_layer_ids(num_target_layers: int) -> tuple[int, ...]:
    """EAGLE-3's low/mid/high layers in vLLM's numbering (id j = the input of target layer j).

    SafeAILab and vLLM capture the inputs of layers ``2, L // 2, L - 3``.  Tiny
    targets (L < 5) get the ids clamped into ``[1, L]`` (hyspec cannot supply
    id 0, the embedding output).
    """
    L = num_target_layers
    return tuple(sorted(min(max(j, 1), L) for j in (2, L // 2, L - 3)))


@dataclass(frozen=True)
class EagleConfig:
    """What an EAGLE head is: its decoder layer's shape plus the EAGLE-specific parts."""

    method: str  # "eagle" (EAGLE-1/2 layout) or "eagle3"
    layer: ModelConfig  # the decoder layers' shape, alike in all of them (hidden size, heads, MLP, RoPE, eps)
    target_hidden_size: int
    vocab_size: int  # the target's vocabulary
    draft_vocab_size: int  # lm_head rows; == vocab_size for EAGLE-1
    fc_bias: bool = False
    input_layernorm: bool = False  # EAGLE-1/2: absent in the first layer; EAGLE-3: always present
    aux_layer_ids: tuple[int, ...] = ()  # EAGLE-3: vLLM ids of the fused target layers, low to high
    norm_before_residual: bool = False  # EAGLE-3 variant: the residual is hidden_norm(f), not f
    own_embeddings: bool = False  # EAGLE-3 heads that carry their own embed_tokens
    num_layers: int = 1  # EAGLE-3: decoder layers; the later ones read the residual stream alone
    use_fc: bool = True  # EAGLE-3: False reads the target's final hidden state, unfused (no aux layers)

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise CheckpointError(f"EAGLE head method must be one of {METHODS}, got {self.method!r}")
        h = self.layer.hidden_size
        if self.num_layers < 1:
            raise CheckpointError(f"an EAGLE head needs at least one decoder layer, got {self.num_layers}")
        if self.method == EAGLE:
            if self.num_layers != 1 or not self.use_fc:
                raise CheckpointError("hyspec's EAGLE-1/2 heads are one decoder layer behind fc")
            if h != self.target_hidden_size:
                raise CheckpointError(f"an EAGLE head's hidden size ({h}) must equal the target's "
                                      f"({self.target_hidden_size}): it feeds the target's lm_head")
            if self.draft_vocab_size != self.vocab_size:
                raise CheckpointError("an EAGLE-1/2 head drafts over the target's whole vocabulary")
        elif not self.use_fc:
            if self.aux_layer_ids:
                raise CheckpointError("an EAGLE-3 head without fc reads the target's final hidden state, "
                                      f"not the layers {list(self.aux_layer_ids)}")
            if h != self.target_hidden_size:
                raise CheckpointError(f"an EAGLE-3 head without fc of hidden size {h} cannot read a target of "
                                      f"hidden size {self.target_hidden_size}: nothing projects the feature")
        if self.method == EAGLE3:
            if self.use_fc and (len(self.aux_layer_ids) != 3 or min(self.aux_layer_ids) < 1):
                raise CheckpointError(f"EAGLE-3 fuses three target layers with ids >= 1 (id 0, the embedding "
                                      f"output, is not available); got {list(self.aux_layer_ids)}")
            if not 1 <= self.draft_vocab_size <= self.vocab_size:
                raise CheckpointError(f"draft_vocab_size {self.draft_vocab_size} must be in [1, {self.vocab_size}]")
            if h != self.target_hidden_size and not self.own_embeddings:
                raise CheckpointError(f"an EAGLE-3 head of hidden size {h} for a target of hidden size "
                                      f"{self.target_hidden_size} needs its own embed_tokens")

    @property
    def hidden_size(self) -> int:
        return self.layer.hidden_size

    @property
    def feature_size(self) -> int:
        """Width of the raw target feature of one token (H, or 3H fused by EAGLE-3's fc)."""
        return self.target_hidden_size * (3 if self.method == EAGLE3 and self.use_fc else 1)

    @property
    def target_aux_layers(self) -> tuple[int, ...]:
        """The fused layers in hyspec's numbering (residual stream *after* layer j), in fusion order."""
        return tuple(j - 1 for j in self.aux_layer_ids)


class EagleHeadBase(nn.Module, metaclass=ABCMeta):
    """A decoder layer over (token, feature) pairs, then ``num_layers - 1`` plain ones (EAGLE-3 only) on the
    residual stream; the target is shared, not a submodule."""

    def __init__(self, cfg: EagleConfig, target: CausalLM, ops: OpTable | None = None,
                 max_positions: int | None = None):
        super().__init__()
        self.config = cfg
        self.ops = ops or target.ops
        self.layer = DecoderLayer(cfg.layer)
        # vLLM's layers 1.. (empty for a one-layer head, so its parameters and state dict are unchanged)
        self.later_layers = nn.ModuleList(DecoderLayer(cfg.layer) for _ in range(cfg.num_layers - 1))
        self.max_positions = max_positions or cfg.layer.max_position_embeddings
        self.register_buffer("cos_sin", cos_sin_cache(cfg.layer, self.max_positions), persistent=False)
        # Plain attribute, not a submodule: the target's weights are neither trained nor saved here.
        object.__setattr__(self, "target", target)

    # -- per-version pieces ---------------------------------------------------------------------

    @abstractmethod
    def pre_attention(self, input_ids: torch.Tensor, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(attention input [..., A], residual [..., H])`` for tokens ``input_ids [...]`` and features ``hidden [..., H]``."""

    @abstractmethod
    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """``[N, H] -> [N, draft_vocab]`` fp32 draft logits."""

    def fuse(self, features: torch.Tensor) -> torch.Tensor:
        """Raw target features ``[N, feature_size]`` -> head input features ``[N, H]``."""
        return features

    def draft_to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary ids -> target ids."""
        return draft_ids

    # -- shared ---------------------------------------------------------------------------------

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.target.embed(input_ids)

    def post_attention(self, attn_out: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        norm = self.layer.post_attention_layernorm
        h, residual = self.ops.rms_norm(attn_out, norm.weight, norm.eps, residual)
        return self.layer.mlp(h) + residual

    def _later_layers(self, h: torch.Tensor, attend) -> torch.Tensor:
        """Layers 1.. on the first layer's output ``h``; ``attend(i, normed)`` runs layer ``i``'s attention.

        As vLLM's ``LlamaDecoderLayer`` with ``layer_idx > 0``: ``input_layernorm`` of the residual stream,
        no embedding, no ``hidden_norm``; the result is the stream after the last layer (its ``hidden_prenorm``).
        """
        for i, layer in enumerate(self.later_layers, start=1):
            out, residual = layer(self.ops, h, None, lambda x, i=i: attend(i, x))
            h = out + residual
        return h

    def forward(
        self,
        input_ids: torch.Tensor,  # [T]
        hidden: torch.Tensor,  # [T, H] fused target features, or the head's own outputs
        positions: torch.Tensor,  # [T]
        kv: tuple[torch.Tensor, torch.Tensor] | Sequence[tuple[torch.Tensor, torch.Tensor]],
        meta: AttentionMetadata,
    ) -> torch.Tensor:  # [T, H] the head's output (stands for the next feature)
        """The serving path: paged attention over the head's KV (prefix, chains and tree masks).

        ``kv``: the head's (k_cache, v_cache) views of the pool, or one such pair per layer (``layout.caches``);
        every layer writes the same slots of its own cache, so one page table serves them all."""
        if positions.numel() and int(positions.max()) >= self.max_positions:
            raise ValueError(f"position {int(positions.max())} exceeds the head's RoPE table ({self.max_positions})")
        caches = (kv,) if isinstance(kv[0], torch.Tensor) else tuple(kv)
        if len(caches) != self.config.num_layers:
            raise ValueError(f"the head has {self.config.num_layers} layers but {len(caches)} KV caches were given")
        x, residual = self.pre_attention(input_ids, hidden)
        attn = self.layer.self_attn(self.ops, x, positions, self.cos_sin, caches[0], meta)
        h = self.post_attention(attn, residual)
        if not self.later_layers:
            return h
        return self._later_layers(h, lambda i, x: self.later_layers[i - 1].self_attn(
            self.ops, x, positions, self.cos_sin, caches[i], meta))

    def forward_dense(self, input_ids: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        """Cache-free causal forward: ``input_ids [B, S]``, ``hidden [B, S, H]`` -> ``[B, S, H]`` (training)."""
        x, residual = self.pre_attention(input_ids, hidden)
        attn = self.layer.self_attn.forward_dense(self.ops, x, self.cos_sin)
        h = self.post_attention(attn, residual)
        if not self.later_layers:
            return h
        return self._later_layers(h, lambda i, x: self.later_layers[i - 1].self_attn.forward_dense(
            self.ops, x, self.cos_sin))


class EagleHead(EagleHeadBase):
    """EAGLE-1/2: ``fc([emb ; f])``, a decoder layer without input_layernorm, the target's lm_head."""

    def __init__(self, cfg: EagleConfig, target: CausalLM, ops: OpTable | None = None,
                 max_positions: int | None = None):
        super().__init__(cfg, target, ops, max_positions)
        h = cfg.hidden_size
        self.fc = nn.Linear(2 * h, h, bias=cfg.fc_bias)
        if not cfg.input_layernorm:
            self.layer.input_layernorm = None

    def pre_attention(self, input_ids, hidden):
        emb = self.embed(input_ids).to(hidden.dtype)
        x = self.fc(torch.cat([emb, hidden], dim=-1))
        norm = self.layer.input_layernorm
        return (x if norm is None else self.ops.rms_norm(x, norm.weight, norm.eps)), x

    def logits(self, h):
        # The target's compute_logits: the op table's ``logits`` (a packed lm_head on the CPU backend).
        return self.target.compute_logits(h)


class Eagle3Head(EagleHeadBase):
    """EAGLE-3: fused low/mid/high features, 2H-wide attention input, own norm and reduced lm_head."""

    def __init__(self, cfg: EagleConfig, target: CausalLM, ops: OpTable | None = None,
                 max_positions: int | None = None):
        super().__init__(cfg, target, ops, max_positions)
        h, lc = cfg.hidden_size, cfg.layer
        # Without fc (use_aux_hidden_state false) the feature is the target's final hidden state as it is.
        self.fc = nn.Linear(3 * cfg.target_hidden_size, h, bias=cfg.fc_bias) if cfg.use_fc else None
        attn = self.layer.self_attn
        attn.qkv_proj = nn.Linear(2 * h, attn.q_size + 2 * attn.kv_size, bias=lc.qkv_bias)
        self.layer.hidden_norm = RMSNorm(h, lc.rms_norm_eps)
        self.norm = RMSNorm(h, lc.rms_norm_eps)
        self.lm_head = nn.Linear(h, cfg.draft_vocab_size, bias=False)
        self.embed_tokens = nn.Embedding(cfg.vocab_size, h) if cfg.own_embeddings else None
        # target id = draft id + d2t[draft id]; t2d marks the target ids the head can draft.
        self.register_buffer("d2t", torch.zeros(cfg.draft_vocab_size, dtype=torch.int64))
        self.register_buffer("t2d", torch.ones(cfg.vocab_size, dtype=torch.bool)
                             if cfg.draft_vocab_size == cfg.vocab_size else
                             torch.zeros(cfg.vocab_size, dtype=torch.bool))

    def set_vocabulary(self, draft_to_target_ids: torch.Tensor) -> None:  # [draft_vocab] int64, strictly increasing
        """Use target ids ``draft_to_target_ids`` as the draft vocabulary (fills d2t and t2d)."""
        ids = draft_to_target_ids.to(device=self.d2t.device, dtype=torch.int64)
        if ids.shape != self.d2t.shape:
            raise CheckpointError(f"the draft vocabulary needs {self.d2t.numel()} ids, got {tuple(ids.shape)}")
        self.d2t.copy_(ids - torch.arange(ids.numel(), device=ids.device))
        self.t2d.zero_()
        self.t2d[ids] = True

    def embed(self, input_ids):
        return self.target.embed(input_ids) if self.embed_tokens is None else self.embed_tokens(input_ids)

    def fuse(self, features):
        return features if self.fc is None else self.fc(features)

    def pre_attention(self, input_ids, hidden):
        ops, layer = self.ops, self.layer
        emb = self.embed(input_ids).to(hidden.dtype)
        e = ops.rms_norm(emb, layer.input_layernorm.weight, layer.input_layernorm.eps)
        f = ops.rms_norm(hidden, layer.hidden_norm.weight, layer.hidden_norm.eps)
        residual = f if self.config.norm_before_residual else hidden
        return torch.cat([e, f], dim=-1), residual

    def logits(self, h):
        h = self.ops.rms_norm(h, self.norm.weight, self.norm.eps)
        return self.lm_head(h).float()  # the module, so a backend's drop-in (packed / quantized) serves it

    def draft_to_target(self, draft_ids):
        return draft_ids + self.d2t[draft_ids]


def build_head(cfg: EagleConfig, target: CausalLM, ops: OpTable | None = None,
               max_positions: int | None = None) -> EagleHeadBase:
    cls = Eagle3Head if cfg.method == EAGLE3 else EagleHead
    return cls(cfg, target, ops, max_positions)
