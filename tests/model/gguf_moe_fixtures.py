"""Tiny mixture-of-experts GGUF files, written with the ``gguf`` package's writer the way llama.cpp's converter
writes them (convert_hf_to_gguf.py, ggml-org/llama.cpp a458664: ``LlamaModel`` for Mixtral, ``Qwen2MoeModel``,
``Qwen3MoeModel``): Mixtral as architecture ``llama`` with its q/k rows permuted, every expert matrix stacked
into ``blk.N.ffn_{gate,up,down}_exps``, the router kept in F32, Qwen2-MoE's shared expert as ``*_shexp``.

As tests.model.gguf_fixtures does for dense models, a quantized file's source checkpoint is rewritten with the
values the quantizer kept, so that "the source checkpoint's logits" is an exact statement about the loader."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from hyspec.model.gguf_checkpoint import permute_rope_rows
from tests.model.gguf_fixtures import _add_tokenizer, _encode, _gguf_name

#: HF model_type -> (GGUF architecture, the routed block's prefix, HF names of the gate / up / down experts)
_ARCH = {
    "mixtral": ("llama", "block_sparse_moe", ("w1", "w3", "w2")),
    "qwen2_moe": ("qwen2moe", "mlp", ("gate_proj", "up_proj", "down_proj")),
    "qwen3_moe": ("qwen3moe", "mlp", ("gate_proj", "up_proj", "down_proj")),
}
_STACKED = ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")
_SHARED = {"shared_expert.gate_proj": "ffn_gate_shexp", "shared_expert.up_proj": "ffn_up_shexp",
           "shared_expert.down_proj": "ffn_down_shexp", "shared_expert_gate": "ffn_gate_inp_shexp"}


def write_moe_gguf(src: Path, out: Path, qtype: str) -> Path:
    """Convert the MoE checkpoint in ``src`` to ``out``, every matrix but the routers stored as ``qtype``."""
    import gguf
    from safetensors.torch import load_file, save_file

    cfg = json.loads((src / "config.json").read_text())
    arch, block, expert_names = _ARCH[cfg["model_type"]]
    state = load_file(str(src / "model.safetensors"))
    w = gguf.GGUFWriter(str(out), arch)
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    rope = cfg.get("rope_parameters") or {}
    w.add_rope_freq_base(rope.get("rope_theta", cfg.get("rope_theta", 10000.0)))
    w.add_vocab_size(cfg["vocab_size"])
    experts = cfg.get("num_local_experts") or cfg["num_experts"]
    w.add_expert_count(experts)
    w.add_expert_used_count(cfg["num_experts_per_tok"])
    if arch != "llama":
        w.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
    if cfg.get("shared_expert_intermediate_size") is not None:
        w.add_expert_shared_feed_forward_length(cfg["shared_expert_intermediate_size"])
    if cfg.get("head_dim") is not None:  # TextModel writes head_dim whenever the config has one
        w.add_key_length(cfg["head_dim"])
        w.add_value_length(cfg["head_dim"])
    _add_tokenizer(w, src)

    kept: dict[str, torch.Tensor] = {}
    heads = {"attn_q": cfg["num_attention_heads"], "attn_k": cfg["num_key_value_heads"]}

    def add(gguf_name: str, values: torch.Tensor, stored_as: str) -> torch.Tensor:
        data, kept_values = _encode(values.float(), stored_as)
        part = gguf_name.split(".")[2] if gguf_name.startswith("blk.") else ""
        if arch == "llama" and part in heads:  # llama.cpp's row order for its interleaved RoPE
            data = permute_rope_rows(torch.from_numpy(np.ascontiguousarray(data)), heads[part]).numpy()
        w.add_tensor(gguf_name, data, raw_dtype=getattr(gguf.GGMLQuantizationType, stored_as))
        return kept_values

    for layer in range(cfg["num_hidden_layers"]):
        m = f"model.layers.{layer}.{block}."
        if m + "gate.weight" not in state:
            continue  # a dense layer: its mlp.* tensors go by the dense names below
        kept[m + "gate.weight"] = add(f"blk.{layer}.ffn_gate_inp.weight", state.pop(m + "gate.weight"), "F32")
        for gguf_part, hf in zip(_STACKED, expert_names):
            names = [f"{m}experts.{e}.{hf}.weight" for e in range(experts)]
            stacked = add(f"blk.{layer}.{gguf_part}.weight", torch.stack([state.pop(n) for n in names]), qtype)
            kept.update(zip(names, stacked.unbind(0)))
        for hf, gguf_part in _SHARED.items():
            if f"{m}{hf}.weight" in state:
                kept[f"{m}{hf}.weight"] = add(f"blk.{layer}.{gguf_part}.weight", state.pop(f"{m}{hf}.weight"), qtype)
    for name, tensor in state.items():
        gguf_name = _gguf_name(name)
        if gguf_name is None:
            raise AssertionError(f"the test converter has no GGUF name for {name}")
        kept[name] = add(gguf_name, tensor, qtype if tensor.dim() == 2 else "F32")  # norms, biases: F32
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    if qtype != "F32":  # the source now holds exactly the values the GGUF keeps
        save_file({k: v.contiguous() for k, v in kept.items()}, str(src / "model.safetensors"),
                  metadata={"format": "pt"})
        cfg["torch_dtype"] = "float32"
        (src / "config.json").write_text(json.dumps(cfg))
    return out
