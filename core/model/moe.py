"""Mixture-of-experts decoders (Mixtral, Qwen2-MoE, Qwen3-MoE) over the Llama-family layers.

Attention, norms and RoPE are hyspec.model.llama's; only the MLP differs.  A routed block computes
what transformers' ``MixtralSparseMoeBlock`` / ``Qwen2MoeSparseMoeBlock`` / ``Qwen3MoeSparseMoeBlock``
compute (transformers 5.x):

* router logits ``x @ W_gate^T`` in the activation dtype, softmax in fp32 over all experts, the
  ``top_k`` largest kept, renormalised to sum 1 when ``norm_topk_prob`` (always for Mixtral);
* each chosen expert a SiLU-gated MLP, its output times the routing weight, summed per token;
* Qwen2-MoE: plus ``sigmoid(x @ w_shared_gate^T) * shared_expert(x)``.

The experts are stacked (``[E, 2I, H]`` gate|up and ``[E, H, I]`` down, the loader fuses the
checkpoint's per-expert matrices) and computed two ways:

* grouped (eager steps): the ``T * top_k`` (token, expert) pairs sorted by expert, one gate|up and one
  down matmul per expert that has tokens, gathered back to token order and summed per token -- a Python
  loop over experts, never over tokens;
* gathered (captured steps, tracing / ONNX export): each pair's expert matrices gathered and multiplied
  with ``bmm`` -- no data-dependent shape and no host read, so a recorded graph replays it right.
  A captured step is one whose ``AttentionMetadata.static_bounds`` is set (hyspec.engine.step_graphs).

A quantized GGUF's experts can instead stay as the file stores them (hyspec.model.moe_stored): then each
expert is a pair of the backend's quantized linears (:meth:`SparseMoE.use_stored_experts`) and the dense
stacks do not exist; the grouped path calls them, the gathered one is refused.
"""
from __future__ import annotations

from dataclasses import replace

import torch
import torch.nn.functional as F
from torch import nn

from hyspec.model.config import ModelConfig
from hyspec.model.llama import MLP, CausalLM, ModelOutput
from hyspec.model.moe_config import MoEConfig
from hyspec.ops import AttentionMetadata, OpTable


class SparseMoE(nn.Module):
    """A routed MLP block: ``[..., H] -> [..., H]``."""

    #: a drafter's weight-only quantization (hyspec.model.quantize_drafter) leaves the routers dense: a rounded
    #: router logit can swap which experts a token uses
    keep_dense_linears = ("gate", "shared_expert_gate")

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        moe: MoEConfig = cfg.moe
        E, H, I = moe.num_experts, cfg.hidden_size, moe.expert_intermediate_size
        self.num_experts, self.top_k, self.intermediate_size = E, moe.top_k, I
        self.norm_topk_prob = moe.norm_topk_prob
        self.fp32_routing_weights = moe.fp32_routing_weights
        self.gate = nn.Linear(H, E, bias=False)  # the router
        self.experts_gate_up = nn.Parameter(torch.empty(E, 2 * I, H))
        self.experts_down = nn.Parameter(torch.empty(E, H, I))
        shared = moe.shared_expert_intermediate_size
        self.shared_expert = MLP(replace(cfg, intermediate_size=shared, mlp_bias=False)) if shared else None
        self.shared_expert_gate = nn.Linear(H, 1, bias=False) if shared else None
        #: True while a captured step runs (set by MoECausalLM.forward): the gathered, sync-free path
        self.static_shapes = False
        #: per expert, the backend's quantized gate|up and down linears (use_stored_experts), or None: dense stacks
        self.stored_gate_up: nn.ModuleList | None = None
        self.stored_down: nn.ModuleList | None = None

    def use_stored_experts(self, gate_up: list[nn.Module], down: list[nn.Module]) -> None:
        """Compute expert ``e`` with ``gate_up[e]`` (``[.., H] -> [.., 2I]``) and ``down[e]`` (``[.., I] -> [.., H]``),
        modules over the checkpoint's quantized blocks, and drop the dense stacks (never filled: the loader
        calls this on a block still on the meta device)."""
        if len(gate_up) != self.num_experts or len(down) != self.num_experts:
            raise ValueError(f"use_stored_experts: {len(gate_up)} gate|up and {len(down)} down modules for "
                             f"{self.num_experts} experts")
        self.stored_gate_up, self.stored_down = nn.ModuleList(gate_up), nn.ModuleList(down)
        self.register_parameter("experts_gate_up", None)
        self.register_parameter("experts_down", None)

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(weights [T, k], expert ids [T, k]) for tokens ``x [T, H]``."""
        probs = torch.softmax(self.gate(x).float(), dim=-1)
        weights, experts = torch.topk(probs, self.top_k, dim=-1)
        if self.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return (weights if self.fp32_routing_weights else weights.to(x.dtype)), experts

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        weights, experts = self.route(x)
        static = self.static_shapes or torch.jit.is_tracing() or torch.onnx.is_in_onnx_export() or (
            x.is_cuda and torch.cuda.is_current_stream_capturing())
        out = (self._gathered if static else self._grouped)(x, weights, experts)
        if self.shared_expert is not None:
            out = out + torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)
        return out.reshape(shape)

    def _expert(self, x: torch.Tensor, e: int) -> torch.Tensor:
        if self.stored_gate_up is not None:
            gate, up = self.stored_gate_up[e](x).split(self.intermediate_size, dim=-1)
            return self.stored_down[e](F.silu(gate) * up)
        gate, up = F.linear(x, self.experts_gate_up[e]).split(self.intermediate_size, dim=-1)
        return F.linear(F.silu(gate) * up, self.experts_down[e])

    def _grouped(self, x: torch.Tensor, weights: torch.Tensor, experts: torch.Tensor) -> torch.Tensor:
        k = self.top_k
        flat = experts.reshape(-1)
        order = torch.argsort(flat, stable=True)  # pairs grouped by expert, each token's experts ascending
        counts = torch.bincount(flat, minlength=self.num_experts).tolist()
        token_of = order // k
        xs = x.index_select(0, token_of)
        ys = torch.empty_like(xs)
        start = 0
        for e, n in enumerate(counts):
            if n:
                ys[start:start + n] = self._expert(xs[start:start + n], e)
                start += n
        ys = ys * weights.reshape(-1).index_select(0, order)[:, None]
        # back to (token, slot) order with a gather, then each token's k outputs summed (a scatter-add here cost
        # more than the expert matmuls of a decode step on the CPU)
        ys = ys.index_select(0, torch.argsort(order))
        return ys.view(x.shape[0], k, -1).sum(dim=1).to(x.dtype)

    def _gathered(self, x: torch.Tensor, weights: torch.Tensor, experts: torch.Tensor) -> torch.Tensor:
        if self.stored_gate_up is not None:
            # which expert module runs is a host decision: a recorded graph would replay the first step's experts
            raise NotImplementedError("a captured / traced step (graph capture, tracing, ONNX export) over experts "
                                      "kept as the checkpoint's quantized blocks is not implemented; load the model "
                                      "with quantization='none' for dense experts")
        T, H = x.shape
        flat = experts.reshape(-1)
        xs = x.repeat_interleave(self.top_k, dim=0).unsqueeze(-1)  # [T*k, H, 1]
        gate, up = torch.bmm(self.experts_gate_up[flat], xs).squeeze(-1).split(self.intermediate_size, dim=-1)
        ys = torch.bmm(self.experts_down[flat], (F.silu(gate) * up).unsqueeze(-1)).squeeze(-1)  # [T*k, H]
        ys = ys * weights.reshape(-1, 1)
        return ys.view(T, self.top_k, H).sum(dim=1).to(x.dtype)


class MoECausalLM(CausalLM):
    """A Llama-family decoder whose routed layers' MLPs are :class:`SparseMoE` blocks."""

    def __init__(self, cfg: ModelConfig, ops: OpTable | None = None, max_positions: int | None = None):
        if cfg.moe is None:
            raise ValueError(f"{cfg.model_type} is not a mixture-of-experts model")
        super().__init__(cfg, ops=ops, max_positions=max_positions)
        for i, layer in enumerate(self.layers):
            if cfg.moe.is_sparse(i):
                layer.mlp = SparseMoE(cfg)
        self._moe_blocks = [layer.mlp for layer in self.layers if isinstance(layer.mlp, SparseMoE)]
        self.layer_stack = None  # the CPU decoder stack runs dense MLPs only (hyspec.cpu_ops.decoder_stack)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                kv_caches: list[tuple[torch.Tensor, torch.Tensor]], meta: AttentionMetadata,
                aux_layers: tuple[int, ...] = (), inputs_embeds: torch.Tensor | None = None) -> ModelOutput:
        static = meta.static_bounds is not None  # a captured step: no host reads, no data-dependent shapes
        for block in self._moe_blocks:
            block.static_shapes = static
        return super().forward(input_ids, positions, kv_caches, meta, aux_layers, inputs_embeds)

    def forward_dense(self, input_ids: torch.Tensor, aux_layers: tuple[int, ...] = ()) -> ModelOutput:
        for block in self._moe_blocks:
            block.static_shapes = False
        return super().forward_dense(input_ids, aux_layers)


def expert_weight_names(cfg: ModelConfig, src: str) -> list[tuple[str, str, str]]:
    """Per expert, the checkpoint names of its (gate, up, down) matrices in the layer with prefix ``src``
    (``model.layers.3.``).  Mixtral stores ``block_sparse_moe.experts.E.w1 / w3 / w2``; Qwen
    ``mlp.experts.E.gate_proj / up_proj / down_proj``."""
    m, names = _routed_prefix(cfg, src)
    return [tuple(f"{m}experts.{e}.{n}.weight" for n in names) for e in range(cfg.moe.num_experts)]


def _routed_prefix(cfg: ModelConfig, src: str) -> tuple[str, tuple[str, str, str]]:
    if cfg.model_type == "mixtral":
        return src + "block_sparse_moe.", ("w1", "w3", "w2")
    return src + "mlp.", ("gate_proj", "up_proj", "down_proj")


def moe_layer_state(cfg: ModelConfig, take, src: str, dst: str, claim=None) -> dict[str, torch.Tensor]:
    """The routed block of one layer from a checkpoint in the published layout, under hyspec's names.

    ``take(name, shape)`` reads a checkpoint tensor (marking it used); ``src`` is the layer's checkpoint
    prefix (``model.layers.3.``), ``dst`` hyspec's (``layers.3.``).  Mixtral stores
    ``block_sparse_moe.{gate, experts.E.w1 / w3 / w2}`` (gate / up / down); Qwen
    ``mlp.{gate, experts.E.gate_proj / up_proj / down_proj}`` and Qwen2-MoE also
    ``mlp.shared_expert.*`` and ``mlp.shared_expert_gate``.  ``claim(name)``: the experts are kept as the
    checkpoint stores them (hyspec.model.moe_stored), so their names are only marked used, never read.
    """
    moe: MoEConfig = cfg.moe
    E, H, I = moe.num_experts, cfg.hidden_size, moe.expert_intermediate_size
    m, _ = _routed_prefix(cfg, src)
    out = dst + "mlp."
    state = {out + "gate.weight": take(m + "gate.weight", (E, H))}
    experts = expert_weight_names(cfg, src)
    if claim is not None:
        for name in (n for names in experts for n in names):
            claim(name)
    else:
        state[out + "experts_gate_up"] = torch.stack([torch.cat([take(gate, (I, H)), take(up, (I, H))])
                                                      for gate, up, _ in experts])
        state[out + "experts_down"] = torch.stack([take(down, (H, I)) for _, _, down in experts])
    S = moe.shared_expert_intermediate_size
    if S:
        s = m + "shared_expert."
        if claim is not None:  # kept as stored too (hyspec.model.moe_stored)
            for name in shared_expert_weight_names(cfg, src):
                claim(name)
        else:
            state[out + "shared_expert.gate_up_proj.weight"] = torch.cat([
                take(s + "gate_proj.weight", (S, H)), take(s + "up_proj.weight", (S, H))])
            state[out + "shared_expert.down_proj.weight"] = take(s + "down_proj.weight", (H, S))
        state[out + "shared_expert_gate.weight"] = take(m + "shared_expert_gate.weight", (1, H))
    return state


def shared_expert_weight_names(cfg: ModelConfig, src: str) -> tuple[str, str, str]:
    """Qwen2-MoE's shared expert's (gate, up, down) checkpoint names in the layer with prefix ``src``."""
    m, _ = _routed_prefix(cfg, src)
    return tuple(f"{m}shared_expert.{n}.weight" for n in ("gate_proj", "up_proj", "down_proj"))


__all__ = ["MoECausalLM", "SparseMoE", "expert_weight_names", "moe_layer_state", "shared_expert_weight_names"]
