"""Tiny GGUF files written with the ``gguf`` package's own writer, from a tiny safetensors checkpoint.

``write_gguf`` converts the way llama.cpp's ``convert_hf_to_gguf.py`` does
(tensor names, the Llama q/k row permutation for interleaved RoPE, metadata,
the byte-level BPE vocabulary), quantizing every matrix to one type.  For the
quantized types it also rewrites the source checkpoint with the values the
quantizer kept, so that "the same logits as the checkpoint it came from" is an
exact statement about hyspec's loader, not about quantization error.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import torch

from hyspec.model.gguf_checkpoint import permute_rope_rows
from tests.model.tiny_checkpoint import CHAT_TEMPLATE, VOCAB, write_tokenizer

QTYPES = ("Q4_0", "Q4_1", "Q8_0", "F16", "BF16", "F32")

_LAYER = {  # HF suffix -> GGUF suffix
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
    "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
}
#: what differs per architecture (llama.cpp's gguf-py tensor_mapping.py)
_ARCH_LAYER = {
    "phi3": {"self_attn.qkv_proj": "attn_qkv", "mlp.gate_up_proj": "ffn_up"},
    "gemma2": {"post_attention_layernorm": "post_attention_norm", "pre_feedforward_layernorm": "ffn_norm",
               "post_feedforward_layernorm": "post_ffw_norm"},
}
_ARCH_LAYER["gemma3"] = _ARCH_LAYER["gemma2"]


def make_source_checkpoint(path: Path, arch: str = "llama", seed: int = 0, rope_scaling: dict | None = None) -> dict:
    """A tiny llama (GQA, untied), qwen2 (qkv bias, tied) or qwen3 (q/k norms, head_dim 32 != hidden/heads)
    checkpoint whose rows are multiples of 32 (``rope_scaling``: a llama's ``rope_scaling`` dict)."""
    import transformers

    path.mkdir(parents=True, exist_ok=True)
    common = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-5,
                  bos_token_id=1, eos_token_id=2, pad_token_id=0)
    if arch == "llama":
        cfg = transformers.LlamaConfig(**common, tie_word_embeddings=False)
        if rope_scaling is not None:
            cfg.rope_parameters = {"rope_theta": 10000.0, **rope_scaling}
        model_cls = transformers.LlamaForCausalLM
    elif arch == "qwen2":
        cfg = transformers.Qwen2Config(**common, tie_word_embeddings=True)
        model_cls = transformers.Qwen2ForCausalLM
    else:
        cfg = transformers.Qwen3Config(**common, head_dim=32, tie_word_embeddings=False)
        model_cls = transformers.Qwen3ForCausalLM
    torch.manual_seed(seed)
    model = model_cls(cfg).eval()
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "norm" in n or n.endswith("bias"):
                p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(path, safe_serialization=True)
    write_tokenizer(path)
    return json.loads((path / "config.json").read_text())


def write_gguf(src: Path, out: Path, qtype: str, arch: str = "llama", *, tokenizer: bool = True,
               architecture_name: str | None = None) -> Path:
    """Convert the checkpoint in ``src`` to ``out`` (a .gguf file), every matrix stored as ``qtype``."""
    import gguf
    from safetensors.torch import load_file, save_file

    cfg = json.loads((src / "config.json").read_text())
    state = load_file(str(src / "model.safetensors"))
    kept: dict[str, torch.Tensor] = {}
    w = gguf.GGUFWriter(str(out), architecture_name or arch)
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    rope = cfg.get("rope_parameters") or {}
    rope = rope.get("full_attention", rope)  # Gemma 3: the global layers' (llama.cpp fixes the local base at 1e4)
    w.add_rope_freq_base(rope.get("rope_theta", cfg.get("rope_theta", 10000.0)))
    if rope.get("rope_type") == "linear":
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(rope["factor"])
    w.add_vocab_size(cfg["vocab_size"])
    if cfg.get("sliding_window"):
        w.add_sliding_window(cfg["sliding_window"])
    for key in ("attn_logit_softcapping", "final_logit_softcapping"):  # Gemma 2 (Gemma 3: final only)
        if cfg.get(key) and not (arch == "gemma3" and key == "attn_logit_softcapping"):
            getattr(w, f"add_{key}")(cfg[key])
    if cfg.get("head_dim") and cfg["head_dim"] != cfg["hidden_size"] // cfg["num_attention_heads"]:
        w.add_key_length(cfg["head_dim"])
        w.add_value_length(cfg["head_dim"])
    if tokenizer:
        _add_tokenizer(w, src)
    heads = {"attn_q": cfg["num_attention_heads"], "attn_k": cfg["num_key_value_heads"]}
    scaling = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    if scaling.get("rope_type") == "llama3":
        w.add_tensor("rope_freqs.weight", llama3_rope_freqs(cfg, scaling))
    if scaling.get("rope_type") in ("longrope", "su"):
        _add_longrope(w, cfg, scaling)
    for name, tensor in state.items():
        gguf_name = _gguf_name(name, arch)
        if gguf_name is None:
            continue
        values = tensor.float()
        if arch in ("gemma2", "gemma3") and name.endswith("norm.weight"):
            values = values + 1  # llama.cpp's converter stores Gemma's (1 + w) (Gemma3Model.norm_shift)
        stored_as = qtype if values.dim() == 2 else "F32"  # llama.cpp keeps norms and biases in F32
        data, kept_values = _encode(values, stored_as)
        kept[name] = kept_values - 1 if arch in ("gemma2", "gemma3") and name.endswith("norm.weight") else kept_values
        part = gguf_name.split(".")[2] if gguf_name.startswith("blk.") else ""
        if arch == "llama" and part in heads:  # llama.cpp's row order for its interleaved RoPE
            data = permute_rope_rows(torch.from_numpy(np.ascontiguousarray(data)), heads[part]).numpy()
        w.add_tensor(gguf_name, data, raw_dtype=getattr(gguf.GGMLQuantizationType, stored_as))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    if qtype not in ("F32",):  # the source now holds exactly the values the GGUF keeps
        save_file({k: v.contiguous() for k, v in kept.items()}, str(src / "model.safetensors"),
                  metadata={"format": "pt"})
        cfg["torch_dtype"] = "float32"
        (src / "config.json").write_text(json.dumps(cfg))
    return out


def _add_longrope(w, cfg: dict, scaling: dict) -> None:
    """Phi-3's longrope as llama.cpp's converter writes it (convert_hf_to_gguf.py, Phi3MiniModel
    set_gguf_parameters / generate_extra_tensors, ggml-org/llama.cpp a458664): the original context as metadata,
    the attention factor it derives from max_position_embeddings / original (not the config's), the factor sets
    as two file-global F32 tensors."""
    orig = cfg["original_max_position_embeddings"]
    scale = cfg["max_position_embeddings"] / orig
    w.add_rope_scaling_orig_ctx_len(orig)
    w.add_rope_scaling_attn_factors(math.sqrt(1 + math.log(scale) / math.log(orig)) if scale > 1.0 else 1.0)
    w.add_tensor("rope_factors_long.weight", np.asarray(scaling["long_factor"], dtype=np.float32))
    w.add_tensor("rope_factors_short.weight", np.asarray(scaling["short_factor"], dtype=np.float32))


def llama3_rope_freqs(cfg: dict, scaling: dict) -> np.ndarray:
    """The ``rope_freqs.weight`` tensor llama.cpp's converter writes for llama3 RoPE scaling, from its published
    rule (convert_hf_to_gguf.py, LlamaModel.generate_extra_tensors, ggml-org/llama.cpp a458664): 1 for
    wavelengths under original_context / high_freq_factor, ``factor`` over original_context / low_freq_factor,
    and 1 / ((1 - smooth) / factor + smooth) between."""
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    base = (cfg.get("rope_parameters") or {}).get("rope_theta", cfg.get("rope_theta", 10000.0))
    factor, low, high = scaling["factor"], scaling.get("low_freq_factor", 1.0), scaling.get("high_freq_factor", 4.0)
    old_context = scaling["original_max_position_embeddings"]
    out = []
    for i in range(0, head_dim, 2):
        wavelen = 2 * math.pi * base ** (i / head_dim)
        if wavelen < old_context / high:
            out.append(1.0)
        elif wavelen > old_context / low:
            out.append(factor)
        else:
            smooth = (old_context / wavelen - low) / (high - low)
            out.append(1.0 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def _encode(values: torch.Tensor, qtype: str) -> tuple[np.ndarray, torch.Tensor]:
    """(what the file stores, the fp32 values a reader gets back)."""
    import gguf
    from gguf import quants

    arr = values.numpy().astype(np.float32)
    if qtype == "F32":
        return arr, values
    if qtype == "F16":
        half = arr.astype(np.float16)
        return half, torch.from_numpy(half.astype(np.float32))
    t = getattr(gguf.GGMLQuantizationType, qtype)
    blocks = quants.quantize(arr, t)
    return blocks, torch.from_numpy(np.ascontiguousarray(quants.dequantize(blocks, t), dtype=np.float32))


def _gguf_name(hf: str, arch: str = "llama") -> str | None:
    if hf == "model.embed_tokens.weight":
        return "token_embd.weight"
    if hf == "model.norm.weight":
        return "output_norm.weight"
    if hf == "lm_head.weight":
        return "output.weight"
    parts = hf.split(".")
    if len(parts) >= 5 and parts[1] == "layers":
        module = ".".join(parts[3:-1])
        names = {**_LAYER, **_ARCH_LAYER.get(arch, {})}
        if module in names:
            return f"blk.{parts[2]}.{names[module]}.{parts[-1]}"
    return None


def _add_tokenizer(w, src: Path) -> None:
    tok = json.loads((src / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    tokens = [None] * len(vocab)
    for text, i in vocab.items():
        tokens[i] = text
    special = {t["content"] for t in tok.get("added_tokens", []) if t.get("special")}
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt2")
    w.add_token_list(tokens)
    w.add_token_types([3 if t in special else 1 for t in tokens])
    w.add_token_merges(merges)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_pad_token_id(0)
    w.add_add_bos_token(False)
    w.add_chat_template(CHAT_TEMPLATE)
