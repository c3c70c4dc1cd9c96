"""A ``tokenizers`` tokenizer built from a GGUF file's vocabulary metadata.

A GGUF carries no ``tokenizer.json``: llama.cpp stores the vocabulary, merges,
token types, special ids, a pre-tokenizer *name* (``tokenizer.ggml.pre``) and
the chat template as metadata.  Byte-level BPE vocabularies (``gpt2``: SmolLM2,
Qwen2/3, Llama 3) are rebuilt here with the ``tokenizers`` library; the split
rule for each pre-tokenizer name is the one llama.cpp applies for that name
(``llama-vocab.cpp``), so hyspec tokenizes the file as llama.cpp does.  For
other vocabulary models (SentencePiece ``llama``, ...) transformers' maintained
GGUF converter is used when transformers is installed.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Any

from hyspec.errors import CheckpointError

_GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

#: tokenizer.ggml.pre -> (split regex, digits split one by one first)
PRE_TOKENIZERS: dict[str, tuple[str, bool]] = {
    "default": (_GPT2_SPLIT, False),
    "gpt2": (_GPT2_SPLIT, False),
    "smollm": (_GPT2_SPLIT, True),
    "starcoder": (_GPT2_SPLIT, True),
    "refact": (_GPT2_SPLIT, True),
    "codeshell": (_GPT2_SPLIT, True),
    "llama-bpe": (_LLAMA3_SPLIT, False),
    "llama3": (_LLAMA3_SPLIT, False),
    "llama-v3": (_LLAMA3_SPLIT, False),
    "smaug-bpe": (_LLAMA3_SPLIT, False),
    "dbrx": (_LLAMA3_SPLIT, False),
    "falcon3": (_LLAMA3_SPLIT, False),
    "qwen2": (_QWEN2_SPLIT, False),
    "deepseek-r1-qwen": (_QWEN2_SPLIT, False),
}

_CONTROL, _USER_DEFINED = 3, 4  # llama.cpp token types


def has_tokenizer(metadata: dict[str, Any]) -> bool:
    return "tokenizer.ggml.tokens" in metadata and "tokenizer.ggml.model" in metadata


def build_gguf_tokenizer(metadata: dict[str, Any], file_name: str):
    """``(tokenizers.Tokenizer, tokenizer_config dict)`` for the vocabulary a GGUF file describes."""
    if not has_tokenizer(metadata):
        raise CheckpointError(f"{file_name} carries no tokenizer metadata (tokenizer.ggml.*); pass the "
                              "tokenizer of the model it was converted from: --tokenizer DIR (LLM(tokenizer=DIR))")
    model = metadata["tokenizer.ggml.model"]
    tokens: list[str] = list(metadata["tokenizer.ggml.tokens"])
    types = list(metadata.get("tokenizer.ggml.token_type") or [1] * len(tokens))
    if model == "gpt2":
        tok = _byte_level_bpe(metadata, tokens, file_name)
    else:
        tok = _transformers_converted(metadata, model, file_name)
    from tokenizers import AddedToken

    special = [AddedToken(t, normalized=False, special=True) for t, k in zip(tokens, types) if k == _CONTROL]
    user = [AddedToken(t, normalized=False, special=False) for t, k in zip(tokens, types) if k == _USER_DEFINED]
    tok.add_special_tokens(special)
    if user:
        tok.add_tokens(user)

    def token(key: str) -> str | None:
        i = metadata.get(f"tokenizer.ggml.{key}")
        return tokens[i] if i is not None and 0 <= i < len(tokens) else None

    config = {
        "bos_token": token("bos_token_id"),
        "eos_token": token("eos_token_id"),
        "unk_token": token("unknown_token_id"),
        "pad_token": token("padding_token_id"),
        # llama.cpp adds BOS to SentencePiece vocabularies unless told otherwise, to BPE ones only when told.
        "add_bos_token": bool(metadata.get("tokenizer.ggml.add_bos_token", model == "llama")),
        "chat_template": metadata.get("tokenizer.chat_template"),
    }
    return tok, config


def _byte_level_bpe(metadata: dict[str, Any], tokens: list[str], file_name: str):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    pre = metadata.get("tokenizer.ggml.pre", "default")
    if pre not in PRE_TOKENIZERS:
        raise CheckpointError(f"{file_name}: GGUF pre-tokenizer {pre!r} is not supported; supported: "
                              f"{', '.join(sorted(PRE_TOKENIZERS))} (or pass --tokenizer DIR)")
    merges = metadata.get("tokenizer.ggml.merges")
    if merges is None:
        raise CheckpointError(f"{file_name}: a byte-level BPE vocabulary without tokenizer.ggml.merges")
    spell = _byte_alphabet()
    alphabet = set(spell.values())
    vocab = {}
    for i, t in enumerate(tokens):
        # Every ordinary token is written in GPT-2's byte alphabet; respell any that is not (mislabelled ones).
        vocab[t if set(t) <= alphabet else "".join(spell[b] for b in t.encode("utf-8"))] = i
    pairs = []
    for m in merges:
        a, sep, b = m.partition(" ")
        if not sep:
            raise CheckpointError(f"{file_name}: malformed merge {m!r} in tokenizer.ggml.merges")
        pairs.append((a, b))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=pairs, ignore_merges=False))
    split, digits = PRE_TOKENIZERS[pre]
    steps = [pre_tokenizers.Digits(individual_digits=True)] if digits else []
    steps += [pre_tokenizers.Split(Regex(split), behavior="isolated"),
              pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    tok.pre_tokenizer = pre_tokenizers.Sequence(steps)
    tok.decoder = decoders.ByteLevel()
    return tok


def _transformers_converted(metadata: dict[str, Any], model: str, file_name: str):
    try:
        from transformers.integrations.gguf.gguf_tokenizer_mapping import GGUF_TOKENIZER_MAPPING, convert_gguf_tokenizer
    except ImportError:
        raise CheckpointError(
            f"{file_name}: its {model!r} vocabulary is built with transformers' GGUF converter, which is not "
            "installed (pip install transformers), or pass --tokenizer DIR") from None
    renames = GGUF_TOKENIZER_MAPPING["tokenizer"]
    tokenizer_dict = {name: metadata[f"tokenizer.{key}"] for key, name in renames.items()
                      if f"tokenizer.{key}" in metadata}
    try:
        backend, _ = convert_gguf_tokenizer(metadata.get("general.architecture", "llama"), tokenizer_dict)
    except Exception as exc:
        raise CheckpointError(f"{file_name}: transformers cannot build its {model!r} tokenizer: {exc}; "
                              "pass --tokenizer DIR") from None
    return backend


@lru_cache(maxsize=1)
def _byte_alphabet() -> dict[int, str]:
    """GPT-2's printable spelling of each byte (the alphabet byte-level BPE vocabularies are written in)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    chars = list(printable)
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {b: chr(c) for b, c in zip(printable, chars)}
