"""A tiny target model for the conformance suite, written with hyspec's own code (no transformers, no download).

The installed suite needs a complete checkpoint directory (config.json,
model.safetensors, tokenizer.json) to run the engine on.  The model is a
random 2-layer Llama with GQA; the tokenizer a byte-level BPE without merges
(259 tokens: the 256 bytes plus pad/bos/eos), whose ids fit the model's 320
embeddings.  Weights use a larger spread than training inits so that argmax
gaps are far above fp32 rounding: greedy identity then needs no near-tie
excuses on this model.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from hyspec.model.config import ModelConfig
from hyspec.model.llama import CausalLM
from hyspec.model.weights import write_safetensors_atomically
from hyspec.train.export import causal_lm_tensors, llama_config_dict, write_config

VOCAB = 320
SPECIAL_TOKENS = ("<pad>", "<s>", "</s>")


@dataclass(frozen=True)
class TinySpec:
    layers: int = 2
    hidden_size: int = 64
    heads: int = 4
    kv_heads: int = 2
    intermediate_size: int = 136
    max_positions: int = 256
    seed: int = 0
    init_std: float = 0.08

    def __post_init__(self) -> None:
        if self.hidden_size % self.heads or self.heads % self.kv_heads:
            raise ValueError(f"TinySpec: hidden {self.hidden_size}, heads {self.heads}, kv heads {self.kv_heads} "
                             "must divide evenly")


def write_tokenizer(path: Path) -> None:
    """Byte-level BPE with no merges: every byte is one token, ids 0-2 are the special tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    vocab.update({ch: len(SPECIAL_TOKENS) + i for i, ch in enumerate(alphabet)})
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>", "add_bos_token": False}))


def make_tiny_target(path: str | Path, spec: TinySpec = TinySpec()) -> Path:
    """Write the tiny checkpoint into ``path`` (created if needed) and return it."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    config = llama_config_dict(
        vocab_size=VOCAB, hidden_size=spec.hidden_size, intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.layers, num_attention_heads=spec.heads, num_key_value_heads=spec.kv_heads,
        head_dim=spec.hidden_size // spec.heads, rms_norm_eps=1e-5, max_position_embeddings=spec.max_positions,
        tie_word_embeddings=False, rope={"rope_theta": 10000.0},
        special_ids={"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}, torch_dtype="float32")
    gen = torch.Generator().manual_seed(spec.seed)
    model = CausalLM(ModelConfig.from_dict(config), max_positions=spec.max_positions)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:  # norms away from 1 so that a kernel ignoring the weight is caught
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(spec.init_std * torch.randn(p.shape, generator=gen))
    write_config(config, path)
    write_safetensors_atomically(causal_lm_tensors(model, torch.float32), path / "model.safetensors",
                                 metadata={"format": "pt"})
    write_tokenizer(path)
    return path


def prompts(count: int, seed: int = 0, min_len: int = 3, max_len: int = 40) -> list[list[int]]:
    """Ragged prompts of token ids (3..258: bytes, no special tokens), some long enough to cross KV pages."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for i in range(count):
        length = min_len + (i * 13 + int(torch.randint(0, 7, (1,), generator=gen))) % (max_len - min_len + 1)
        # repeat a short motif so that prompt-lookup (ngram) finds matches to draft from
        motif = torch.randint(3, 259, (max(2, length // 3),), generator=gen).tolist()
        out.append((motif * 4)[:length])
    return out


__all__ = ["TinySpec", "VOCAB", "make_tiny_target", "prompts"]
