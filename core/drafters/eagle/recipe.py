"""Training recipes for ``eagle`` (EAGLE-1/2 heads) and ``eagle3`` (EAGLE-3 heads).

Both read a :class:`~hyspec.train.base.TargetBatch` whose pair ``i`` is
(target feature ``f_i``, token ``t_{i+1}``); the head's output at pair ``i``
predicts ``f_{i+1}`` and the distribution of ``t_{i+2}``, which the target
gives as ``softmax(lm_head(f_{i+1}))``.  Pair ``i`` counts where the batch's
``loss_mask`` counts position ``i + 1``.  Both save the public layout
(:mod:`hyspec.drafters.eagle.checkpoint`).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from hyspec.drafters.checkpoint_io import STORAGE
from hyspec.drafters.eagle.checkpoint import load_head, save_head
from hyspec.drafters.eagle.model import (EAGLE, EAGLE3, Eagle3Head, EagleConfig, EagleHead, EagleHeadBase, build_head,
                                         default_aux_layer_ids)
from hyspec.errors import ConfigError
from hyspec.model.config import ModelConfig
from hyspec.model.llama import CausalLM
from hyspec.train.base import DrafterRecipe, TargetBatch, register_recipe

# option -> default (None: taken from the target)
COMMON_OPTIONS: dict[str, Any] = {"layers": 1, "hidden_size": None, "intermediate_size": None, "heads": None,
                                  "kv_heads": None, "init_std": 0.02, "storage": None}
# fc_bias off by default: SafeAILab reads config.json's "bias" either way, while vLLM's EAGLE-1
# module has no fc bias and would silently drop one.
EAGLE_OPTIONS = {**COMMON_OPTIONS, "fc_bias": False, "feature_noise": 0.1}
EAGLE3_OPTIONS = {**COMMON_OPTIONS, "fc_bias": False, "ttt_steps": 7, "draft_vocab_size": None, "token_counts": None}
# EAGLE-3's training-time test weights step j by 0.8 ** j (SafeAILab's train script).
TTT_DECAY = 0.8


def _options(method: str, options: dict[str, Any], known: dict[str, Any]) -> dict[str, Any]:
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise ConfigError(f"{method}.{unknown[0]}", f"unknown option; {method} options: {', '.join(known)}")
    return {**known, **{k: v for k, v in options.items() if v is not None}}


def _positive_int(method: str, opts: dict[str, Any], key: str) -> int:
    value = opts[key]
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"{method}.{key}", f"must be a positive integer, got {value!r}")
    return value


def layer_config(method: str, target_cfg: ModelConfig, opts: dict[str, Any]) -> ModelConfig:
    """The head's decoder layer: the target's shape unless the options say otherwise."""
    if opts["layers"] != 1:
        raise ConfigError(f"{method}.layers", f"EAGLE heads have exactly one decoder layer, got {opts['layers']!r}")
    hidden = opts["hidden_size"] or target_cfg.hidden_size
    if hidden != target_cfg.hidden_size:
        raise ConfigError(f"{method}.hidden_size", f"must equal the target's hidden size {target_cfg.hidden_size} "
                                                   f"(the head shares the target's embeddings), got {hidden!r}")
    heads = opts["heads"] or target_cfg.num_attention_heads
    kv_heads = opts["kv_heads"] or (target_cfg.num_key_value_heads if not opts["heads"] else heads)
    for key, value in (("heads", heads), ("kv_heads", kv_heads)):
        _positive_int(method, {key: value}, key)
    if heads % kv_heads:
        raise ConfigError(f"{method}.kv_heads", f"heads {heads} is not a multiple of kv_heads {kv_heads}")
    if heads != target_cfg.num_attention_heads and hidden % heads:
        raise ConfigError(f"{method}.heads", f"hidden size {hidden} is not a multiple of heads {heads}")
    head_dim = target_cfg.head_dim if heads == target_cfg.num_attention_heads else hidden // heads
    intermediate = _positive_int(method, {"intermediate_size": opts["intermediate_size"] or target_cfg.intermediate_size},
                                 "intermediate_size")
    raw = {k: target_cfg.raw[k] for k in ("rope_theta", "rope_scaling", "rope_parameters", "bos_token_id",
                                          "eos_token_id", "pad_token_id") if target_cfg.raw.get(k) is not None}
    raw.update({"model_type": "llama", "hidden_size": hidden, "intermediate_size": intermediate,
                "num_attention_heads": heads, "num_key_value_heads": kv_heads, "head_dim": head_dim,
                "num_hidden_layers": 1, "vocab_size": target_cfg.vocab_size, "rms_norm_eps": target_cfg.rms_norm_eps,
                "max_position_embeddings": target_cfg.max_position_embeddings})
    return ModelConfig(model_type="llama", vocab_size=target_cfg.vocab_size, hidden_size=hidden,
                       intermediate_size=intermediate, num_hidden_layers=1, num_attention_heads=heads,
                       num_key_value_heads=kv_heads, head_dim=head_dim, rms_norm_eps=target_cfg.rms_norm_eps,
                       max_position_embeddings=target_cfg.max_position_embeddings, tie_word_embeddings=False,
                       qkv_bias=False, o_bias=False, mlp_bias=False, qk_norm=False, rope=target_cfg.rope,
                       torch_dtype=target_cfg.torch_dtype, raw=raw)


def _storage(method: str, opts: dict[str, Any]) -> str | None:
    """``storage``: how the saved file holds the weights (None: as trained; bfloat16; int8 per row)."""
    value = opts["storage"]
    if value is not None and value not in STORAGE:
        raise ConfigError(f"{method}.storage", f"must be one of {', '.join(STORAGE)}, got {value!r}")
    return value


def _init(head: nn.Module, std: float) -> None:
    """N(0, std) linear weights, zero biases, unit norms (Hugging Face's Llama initialisation)."""
    with torch.no_grad():
        for module in head.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                module.weight.normal_(0.0, std)
                if getattr(module, "bias", None) is not None:
                    module.bias.zero_()


def load_saved_head(method: str, drafter: EagleHeadBase, target: CausalLM, folder: Path) -> None:
    """``--init-from``: the saved head's weights (and, for EAGLE-3, its draft vocabulary) into ``drafter``."""
    saved = load_head(folder, target, method, dtype=torch.float32, device="cpu")  # checks the target's shapes
    if saved.config.num_layers != 1 or not saved.config.use_fc:
        # Copying such a head into the one-layer fc head trained here would drop layers or invent an fc.
        raise ConfigError("--init-from", f"the {method} head in {folder} has {saved.config.num_layers} decoder "
                                         f"layer(s){'' if saved.config.use_fc else ' and no fc'}; hyspec trains "
                                         "one-layer EAGLE-3 heads behind fc only")
    if saved.config.layer.hidden_size != drafter.config.layer.hidden_size or \
            saved.config.layer.intermediate_size != drafter.config.layer.intermediate_size or \
            saved.config.draft_vocab_size != drafter.config.draft_vocab_size:
        raise ConfigError("--init-from", f"the {method} head in {folder} (hidden {saved.config.layer.hidden_size}, "
                                         f"MLP {saved.config.layer.intermediate_size}, draft vocabulary "
                                         f"{saved.config.draft_vocab_size}) is not the shape being trained "
                                         f"(hidden {drafter.config.layer.hidden_size}, MLP "
                                         f"{drafter.config.layer.intermediate_size}, draft vocabulary "
                                         f"{drafter.config.draft_vocab_size})")
    state = {k: v for k, v in saved.state_dict().items() if k in drafter.state_dict()}
    with torch.no_grad():
        drafter.load_state_dict(state, strict=False)
    if isinstance(drafter, Eagle3Head):
        # The saved head's vocabulary wins over the one chosen from this run's data: its lm_head rows mean those ids.
        drafter.set_vocabulary(saved.draft_to_target(torch.arange(saved.config.draft_vocab_size)))


def _masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:  # [B, T], [B, T] bool -> scalar
    return (values * mask).sum() / mask.sum().clamp_min(1)


class EagleRecipe(DrafterRecipe):
    """EAGLE-1 (Li et al. 2024, "EAGLE: Speculative Sampling Requires Rethinking Feature Uncertainty", §4.2).

    ``L = L_reg + w_cls * L_cls`` with ``L_reg = SmoothL1(f_{i+1}, f^_{i+1})``
    (feature regression) and ``L_cls = CrossEntropy(p_{i+2}, p^_{i+2})`` where
    ``p_{i+2} = softmax(LM_head(f_{i+1}))`` is the target's distribution and
    ``p^_{i+2} = softmax(LM_head(f^_{i+1}))`` the head's; ``w_cls = 0.1``.  As
    in the paper, the input features get uniform noise U(-a, a), a = 0.1
    (option ``feature_noise``), to make the head robust to its own errors.
    """

    method = EAGLE
    options = EAGLE_OPTIONS
    w_reg, w_cls = 1.0, 0.1

    def build(self, target: CausalLM, options: dict[str, Any]) -> nn.Module:
        opts = _options(self.method, options, self.options)
        cfg = EagleConfig(EAGLE, layer_config(self.method, target.config, opts), target.config.hidden_size,
                          target.config.vocab_size, target.config.vocab_size, fc_bias=bool(opts["fc_bias"]))
        head = EagleHead(cfg, target, max_positions=target.max_positions).to(target.embed_tokens.weight.device)
        _init(head, float(opts["init_std"]))
        head.feature_noise = float(opts["feature_noise"])
        head.storage = _storage(self.method, opts)
        return head

    def loss(self, drafter: nn.Module, target: CausalLM, batch: TargetBatch) -> tuple[torch.Tensor, dict[str, float]]:
        head: EagleHeadBase = drafter
        f = batch.hidden.to(head.fc.weight.dtype)  # [B, S, H]
        inputs = f[:, :-1]
        noise = getattr(head, "feature_noise", 0.0)
        if head.training and noise > 0:
            inputs = inputs + torch.empty_like(inputs).uniform_(-noise, noise)
        pred = head.forward_dense(batch.input_ids[:, 1:], inputs)  # [B, S-1, H] stands for f[:, 1:]
        mask = batch.loss_mask[:, 1:].to(pred.device)
        with torch.no_grad():
            target_p = torch.softmax(target.compute_logits(batch.hidden[:, 1:]), dim=-1)  # [B, S-1, V]
        reg = _masked_mean(F.smooth_l1_loss(pred.float(), f[:, 1:].float(), reduction="none").mean(-1), mask)
        logp = torch.log_softmax(head.logits(pred), dim=-1)
        cls = _masked_mean(-(target_p * logp).sum(-1), mask)
        with torch.no_grad():
            acc = _masked_mean((logp.argmax(-1) == target_p.argmax(-1)).float(), mask)
        loss = self.w_reg * reg + self.w_cls * cls
        return loss, {"reg": reg.item(), "cls": cls.item(), "acc": acc.item()}

    def load_weights(self, drafter: nn.Module, target: CausalLM, folder: Path) -> None:
        load_saved_head(self.method, drafter, target, folder)

    def save(self, drafter: nn.Module, target_dir: Path, out_dir: Path) -> None:
        save_head(drafter, out_dir, storage=getattr(drafter, "storage", None))


def ttt_attention(
    q: torch.Tensor,  # [B, T, Hq, D] queries of step j
    keys: list[torch.Tensor],  # steps 0..j, each [B, T, Hkv, D]
    values: list[torch.Tensor],  # steps 0..j, each [B, T, Hkv, D]
    scale: float,
) -> torch.Tensor:  # [B, T, Hq, D]
    """Attention of the training-time test: what a depth-j tree node sees at inference.

    Query ``i`` of step ``j`` stands for a depth-``j`` node grown from pair ``i``:
    it sees the committed pairs ``0..i`` (step 0's keys, causally) and its own
    ancestors and itself -- step ``s``'s key at the same index ``i``, s = 1..j.
    """
    rep = q.shape[2] // keys[0].shape[2]
    ks = [k.repeat_interleave(rep, dim=2) for k in keys]
    vs = [v.repeat_interleave(rep, dim=2) for v in values]
    t = q.shape[1]
    causal = torch.ones(t, t, dtype=torch.bool, device=q.device).tril()
    s0 = torch.einsum("bihd,bjhd->bhij", q, ks[0]).float() * scale  # [B, Hq, T, T]
    s0 = s0.masked_fill(~causal, float("-inf"))
    diag = [(q * k).sum(-1).float().transpose(1, 2)[..., None] * scale for k in ks[1:]]  # [B, Hq, T, 1] each
    w = torch.softmax(torch.cat([s0, *diag], dim=-1), dim=-1).to(q.dtype)
    out = torch.einsum("bhij,bjhd->bihd", w[..., :t], vs[0])
    for s, v in enumerate(vs[1:]):
        out = out + w[..., t + s].transpose(1, 2)[..., None] * v
    return out


def ttt_unroll(
    head: Eagle3Head,
    input_ids: torch.Tensor,  # [B, S]
    raw: torch.Tensor,  # [B, S-1, 3H] raw target features of pairs 0..S-2
    steps: int,
) -> list[torch.Tensor]:  # per step j: [B, S-1, H] head outputs
    """The training-time test: step j reads token ``t_{i+j+1}`` at position ``i + j`` and step j-1's output.

    Step j's output at pair ``i`` is what a depth-``j`` draft node grown from
    pair ``i`` outputs at inference (its ancestors' tokens being the data's).
    Tokens past the end are padding; the caller masks their losses.
    """
    ops, attn = head.ops, head.layer.self_attn
    b, t = input_ids.shape[0], input_ids.shape[1] - 1
    hidden = head.fuse(raw)
    pad = input_ids.new_zeros(b, 1)
    keys: list[torch.Tensor] = []
    values: list[torch.Tensor] = []
    outputs = []
    for j in range(min(steps, t)):
        tokens = torch.cat([input_ids[:, j + 1:], pad.expand(b, j)], dim=1)[:, :t]
        x, residual = head.pre_attention(tokens, hidden)
        positions = (torch.arange(t, device=input_ids.device) + j).repeat(b)
        q, k, v = attn.project(ops, x.reshape(b * t, -1), positions, head.cos_sin)
        q, k, v = (z.view(b, t, *z.shape[1:]) for z in (q, k, v))
        keys.append(k)
        values.append(v)
        out = ttt_attention(q, keys, values, attn.scale)
        hidden = head.post_attention(attn.o_proj(out.reshape(b, t, attn.q_size)), residual)
        outputs.append(hidden)  # the next step reads the head's own output
    return outputs


class Eagle3Recipe(DrafterRecipe):
    """EAGLE-3 (Li et al. 2025, "EAGLE-3: Scaling up Inference Acceleration of LLMs via Training-Time Test", §3).

    No feature loss: the head is trained only on the token distribution, with a
    *training-time test* unroll of ``K`` steps (option ``ttt_steps``, 7 as in
    SafeAILab's script).  Step 0 reads the fused target features; step ``j``
    reads the head's own outputs of step ``j - 1`` with the tokens one further
    along, attends as a depth-``j`` tree node would (:func:`ttt_attention`), and
    is scored by ``CE(p_target, p^)`` against the target's next-token
    distribution restricted to the draft vocabulary (``t2d``), where the
    target's top token is in it.  ``L = sum_j 0.8^j L_j``.
    """

    method = EAGLE3
    options = EAGLE3_OPTIONS
    wants_token_counts = True

    def aux_layers(self, target_cfg: ModelConfig) -> tuple[int, ...]:
        return tuple(sorted({j - 1 for j in default_aux_layer_ids(target_cfg.num_hidden_layers)}))

    def build(self, target: CausalLM, options: dict[str, Any]) -> nn.Module:
        opts = _options(self.method, options, self.options)
        tc = target.config
        vocab_ids = self._draft_vocabulary(tc.vocab_size, opts)
        cfg = EagleConfig(EAGLE3, layer_config(self.method, tc, opts), tc.hidden_size, tc.vocab_size,
                          vocab_ids.numel(), fc_bias=bool(opts["fc_bias"]), input_layernorm=True,
                          aux_layer_ids=default_aux_layer_ids(tc.num_hidden_layers))
        steps = _positive_int(self.method, opts, "ttt_steps")
        head = Eagle3Head(cfg, target, max_positions=target.max_positions + steps)  # step j reads position i + j
        _init(head, float(opts["init_std"]))
        head.set_vocabulary(vocab_ids)
        head.ttt_steps = steps
        head.storage = _storage(self.method, opts)
        return head.to(target.embed_tokens.weight.device)

    def _draft_vocabulary(self, vocab: int, opts: dict[str, Any]) -> torch.Tensor:  # sorted target ids
        """The ``draft_vocab_size`` most frequent tokens of the data (option ``token_counts [V]``), or all."""
        size = opts["draft_vocab_size"] or vocab
        size = _positive_int(self.method, {"draft_vocab_size": size}, "draft_vocab_size")
        if size > vocab:
            raise ConfigError(f"{self.method}.draft_vocab_size", f"{size} exceeds the target's vocabulary ({vocab})")
        if size == vocab:
            return torch.arange(vocab)
        counts = opts["token_counts"]
        if counts is None:
            raise ConfigError(f"{self.method}.token_counts", "a reduced draft vocabulary needs the data's token "
                                                             "counts (a list of vocab_size frequencies)")
        counts = torch.as_tensor(counts, dtype=torch.float64).flatten()
        if counts.numel() != vocab:
            raise ConfigError(f"{self.method}.token_counts", f"needs {vocab} entries, got {counts.numel()}")
        # Most frequent first; ties to the lower id, so the choice is reproducible.
        order = sorted(range(vocab), key=lambda t: (-float(counts[t]), t))[:size]
        return torch.tensor(sorted(order), dtype=torch.int64)

    def loss(self, drafter: nn.Module, target: CausalLM, batch: TargetBatch) -> tuple[torch.Tensor, dict[str, float]]:
        head: Eagle3Head = drafter
        ids, b, t = batch.input_ids, batch.input_ids.shape[0], batch.input_ids.shape[1] - 1
        raw = torch.cat([batch.aux[j] for j in head.config.target_aux_layers], dim=-1)[:, :t]
        # Logits only where a loss counts (the target's at counted positions, the head's at valid pairs):
        # prompts and padding hold a third or more of a self-generated window, and the [N, V] products
        # are most of a step's arithmetic.
        counted = batch.loss_mask.to(ids.device)  # [B, S]
        row_of = torch.full(counted.shape, -1, dtype=torch.int64, device=ids.device)
        row_of[counted] = torch.arange(int(counted.sum()), device=ids.device)
        with torch.no_grad():
            target_logits = target.compute_logits(batch.hidden[counted])  # [N, V]
            t2d = head.t2d.to(target_logits.device)
            in_vocab = t2d[target_logits.argmax(-1)]  # [N]: the target's top token can be drafted
            target_p = torch.softmax(target_logits[:, t2d], dim=-1)  # [N, Vd] over the draft vocabulary
            target_top = target_p.argmax(-1)
        total = torch.zeros((), device=target_p.device)
        metrics: dict[str, float] = {}
        outputs = ttt_unroll(head, ids, raw.to(head.fc.weight.dtype), getattr(head, "ttt_steps", EAGLE3_OPTIONS["ttt_steps"]))
        for j, h in enumerate(outputs):
            # Step j, pair i predicts the token after t_{i+j+1}: the target's distribution at position i+j+1.
            rows = torch.full((b, t), -1, dtype=torch.int64, device=ids.device)
            rows[:, : t - j] = row_of[:, j + 1:][:, : t - j]
            valid = rows >= 0
            valid[valid.clone()] = in_vocab[rows[valid]]
            n = int(valid.sum())
            if n == 0:
                metrics[f"acc{j}"], metrics[f"loss{j}"] = 0.0, 0.0
                continue
            r = rows[valid]
            logp = torch.log_softmax(head.logits(h[valid]), dim=-1)  # [n, Vd]
            step_loss = -(target_p[r] * logp).sum(-1).mean()
            total = total + (TTT_DECAY ** j) * step_loss
            with torch.no_grad():
                metrics[f"acc{j}"] = (logp.argmax(-1) == target_top[r]).float().mean().item()
            metrics[f"loss{j}"] = step_loss.item()
        return total, metrics

    def load_weights(self, drafter: nn.Module, target: CausalLM, folder: Path) -> None:
        load_saved_head(self.method, drafter, target, folder)

    def save(self, drafter: nn.Module, target_dir: Path, out_dir: Path) -> None:
        save_head(drafter, out_dir, storage=getattr(drafter, "storage", None))


register_recipe(EagleRecipe())
register_recipe(Eagle3Recipe())
