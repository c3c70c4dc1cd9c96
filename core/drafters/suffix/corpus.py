"""A suffix corpus: token sequences shipped with a target, a read-only third source for suffix decoding.

Suffix decoding drafts from what it has seen: the request's own tokens and earlier responses.  On a
cold start (a fresh server, a benchmark that empties its cache each pass) the second source is empty,
and a code completion can copy from little but its own prompt.  A corpus of the *target's own*
responses to other prompts fills that gap the way retrieval drafting does (REST, He et al. 2024: a
datastore searched for the context's suffix): the target words the same idioms the same way
(``return result``, ``for i in range(len(``, the chat template's opening lines), so a match in the
corpus predicts what the target will say next.  Drafts stay drafts -- every token is verified -- so
the corpus moves only speed, never output.

Off by default.  The corpus built for the default model (``"default"``, assets/smollm2-suffix-corpus)
raised HumanEval's committed tokens per step by ~7 % on the 2-core Intel VM but not its speed (three
interleaved passes of 16 prompts: 185.1 tok/s without, 183.1 with): the extra drafts it makes accept
less than the prompt's and cost verified rows, which on that CPU are not free.  Where a verified row
costs little (an accelerator) more tokens per step is more speed; measure before turning it on.

Format (a directory): ``corpus.safetensors`` with ``tokens`` (the sequences concatenated, uint16 where
the vocabulary fits, else int32) and ``offsets`` (int64, one more than the sequences: sequence i is
``tokens[offsets[i]:offsets[i + 1]]``), and ``corpus.json``: the vocabulary it was tokenized with
(``vocab_size`` and ``vocab_sha256``, the hash of the id-ordered token strings) and how it was built
(``recipe``).  A corpus tokenized for another vocabulary is refused, naming both.

Memory: the store keeps every token and up to two index entries per position (``TokenStore``);
SmolLM2's corpus (243,593 tokens) takes 0.6 s to index and about 26 MB by the store's estimate,
fixed, beside the bounded cache of responses.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from hyspec.errors import CheckpointError

TENSORS_FILE = "corpus.safetensors"
MANIFEST_FILE = "corpus.json"
FORMAT_VERSION = 1
#: the corpus built for the default model (assets/<this>): suffix_decoding_corpus "default"
DEFAULT_CORPUS_DIR = "smollm2-suffix-corpus"


def vocab_sha256(tokenizer: Any) -> str:
    """A fingerprint of a tokenizer's vocabulary: sha256 of its token strings in id order."""
    vocab = tokenizer.get_vocab()
    ordered = sorted(vocab.items(), key=lambda kv: kv[1])
    return hashlib.sha256(json.dumps(ordered, ensure_ascii=False).encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class SuffixCorpus:
    sequences: list[list[int]]
    manifest: dict[str, Any]
    path: Path

    @property
    def num_tokens(self) -> int:
        return sum(map(len, self.sequences))


def save_corpus(out_dir: str | Path, sequences: Sequence[Sequence[int]], tokenizer: Any,
                recipe: dict[str, Any], vocab_size: int | None = None) -> Path:
    """Write ``sequences`` (token ids of ``tokenizer``) as a corpus directory; returns it.  ``vocab_size``: the
    target's (its embedding may have more rows than the tokenizer has tokens); default the tokenizer's."""
    import torch
    from safetensors.torch import save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    vocab_size = vocab_size if vocab_size is not None else len(tokenizer.get_vocab())
    flat = [t for s in sequences for t in s]
    if any(not 0 <= t < vocab_size for t in flat):
        raise ValueError(f"a token id outside the vocabulary (0..{vocab_size - 1})")
    offsets = [0]
    for s in sequences:
        offsets.append(offsets[-1] + len(s))
    dtype = torch.uint16 if vocab_size <= 1 << 16 else torch.int32
    save_file({"tokens": torch.tensor(flat, dtype=torch.int32).to(dtype),
               "offsets": torch.tensor(offsets, dtype=torch.int64)}, str(out / TENSORS_FILE))
    manifest = {"format": FORMAT_VERSION, "vocab_size": vocab_size, "vocab_sha256": vocab_sha256(tokenizer),
                "sequences": len(sequences), "tokens": len(flat), "recipe": recipe}
    (out / MANIFEST_FILE).write_text(json.dumps(manifest, indent=1) + "\n")
    return out


def load_corpus(path: str | Path, tokenizer: Any = None, vocab_size: int | None = None) -> SuffixCorpus:
    """The corpus in ``path``, checked against the target's vocabulary.

    ``tokenizer`` (the target's) is compared by fingerprint; without one (a remote draft worker) only
    ``vocab_size`` is.  Errors name the file and both vocabularies."""
    path = Path(path)
    manifest_file, tensors_file = path / MANIFEST_FILE, path / TENSORS_FILE
    if not manifest_file.is_file() or not tensors_file.is_file():
        raise CheckpointError(f"suffix corpus {path}: expected {MANIFEST_FILE} and {TENSORS_FILE} in it "
                              "(scripts/build_suffix_corpus.py writes them)")
    try:
        manifest = json.loads(manifest_file.read_text(encoding="utf-8"))
        corpus_vocab, corpus_sha = int(manifest["vocab_size"]), str(manifest["vocab_sha256"])
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"suffix corpus {manifest_file}: unreadable manifest ({exc})") from None
    if manifest.get("format") != FORMAT_VERSION:
        raise CheckpointError(f"suffix corpus {manifest_file}: format {manifest.get('format')!r}, "
                              f"this hyspec reads {FORMAT_VERSION}")
    target_sha = vocab_sha256(tokenizer) if tokenizer is not None else None
    if target_sha is not None and target_sha != corpus_sha:
        raise CheckpointError(f"suffix corpus {path} was tokenized for another vocabulary: its {corpus_vocab} "
                              f"tokens (sha256 {corpus_sha[:12]}) against the target's "
                              f"{vocab_size if vocab_size is not None else len(tokenizer.get_vocab())} "
                              f"(sha256 {target_sha[:12]})")
    if vocab_size is not None and corpus_vocab != vocab_size:
        raise CheckpointError(f"suffix corpus {path} was built for a vocabulary of {corpus_vocab} tokens; "
                              f"the target has {vocab_size}")
    import torch
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        tensors = load_file(str(tensors_file))
        tokens, offsets = tensors["tokens"].to(torch.int64), tensors["offsets"]
    except (OSError, SafetensorError, KeyError) as exc:
        raise CheckpointError(f"suffix corpus {tensors_file}: unreadable ({exc})") from None
    bounds = offsets.tolist()
    ok = (offsets.dim() == 1 and len(bounds) >= 1 and bounds[0] == 0 and bounds[-1] == tokens.numel()
          and all(a <= b for a, b in zip(bounds, bounds[1:])))
    if not ok:
        raise CheckpointError(f"suffix corpus {tensors_file}: offsets do not cut its {tokens.numel()} tokens "
                              "into sequences")
    if tokens.numel() and not 0 <= int(tokens.min()) <= int(tokens.max()) < corpus_vocab:
        raise CheckpointError(f"suffix corpus {tensors_file}: a token id outside its vocabulary of {corpus_vocab}")
    flat = tokens.tolist()
    sequences = [flat[a:b] for a, b in zip(bounds, bounds[1:]) if b > a]
    return SuffixCorpus(sequences, manifest, path)


def default_corpus_dir() -> Path:
    """Where the corpus built for the default model lives (``suffix_decoding_corpus: "default"``)."""
    from hyspec.assets import assets_dir

    return assets_dir() / DEFAULT_CORPUS_DIR


__all__ = ["DEFAULT_CORPUS_DIR", "SuffixCorpus", "default_corpus_dir", "load_corpus", "save_corpus", "vocab_sha256"]
