"""A complete tiny checkpoint directory: random HF weights + a real byte-level BPE tokenizer."""
from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

from tests.model.hf_fixtures import make_hf_model

VOCAB = 320
CHAT_TEMPLATE = ("{% for m in messages %}{{ '<|' + m['role'] + '|>\\n' + m['content'] + '\\n' }}{% endfor %}"
                 "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}")


@lru_cache(maxsize=1)
def _corpus() -> tuple[str, ...]:
    """The text the tiny tokenizer's merges are learnt from: frozen in tests/data (the first 40 source files of
    core/ as of 2026-12-02).  It used to be read from core/ at test time, so every new or edited source file
    changed the merges, the tokenization of every test prompt, and with it token counts and page boundaries
    the tests depend on (a new core/bench/ module turned one compaction test from 20 freed pages to 18)."""
    import gzip

    data = Path(__file__).resolve().parents[1] / "data" / "tiny_tokenizer_corpus.json.gz"
    return tuple(json.loads(gzip.decompress(data.read_bytes())))


def write_tokenizer(path: Path, vocab_size: int = VOCAB) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<pad>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(_corpus(), trainer)
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>", "add_bos_token": False,
        "chat_template": CHAT_TEMPLATE}))


def make_checkpoint(path: Path, family: str = "llama_gqa", layers: int = 2, hidden_size: int = 64, seed: int = 0,
                    dtype=None, intermediate_size: int | None = None):
    """Write a tiny model (vocab 320, ids 0/1/2 = pad/bos/eos) with its tokenizer; return the HF model."""
    import torch

    path.mkdir(parents=True, exist_ok=True)
    model = make_hf_model(family, path, vocab_size=VOCAB, hidden_size=hidden_size, layers=layers, seed=seed,
                          dtype=dtype or torch.float32, intermediate_size=intermediate_size)
    write_tokenizer(path)
    return model
