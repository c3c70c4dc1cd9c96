"""Data sources, tokenisation, packing and deterministic batches for train-draft."""
from __future__ import annotations

import pytest
import torch

from hyspec.errors import HyspecError
from hyspec.model.tokenizer import Tokenizer
from hyspec.train.data import (BatchSampler, Corpus, DataStats, load_corpus, pack_windows, resolve_sources,
                               sample_prompts, stdlib_files)


@pytest.fixture(scope="module")
def tok(target_dir):
    return Tokenizer(target_dir)


def test_folder_expands_to_text_files_and_jsonl_records(tok, corpus_dir, tmp_path):
    (corpus_dir / ".hidden").mkdir(exist_ok=True)
    (corpus_dir / ".hidden" / "skip.py").write_text("x = 1\n")
    (corpus_dir / "image.bin").write_bytes(b"\x00\x01")
    files = resolve_sources([str(corpus_dir)])
    assert sorted(f.name for f in files) == ["bisect.py", "colorsys.py", "extra.jsonl", "keyword.py", "notes.md"]
    corpus = load_corpus([str(corpus_dir)], tok)
    assert corpus.stats.files == 5 and corpus.stats.documents == 6  # the jsonl file holds two records
    assert corpus.tokens.numel() == corpus.stats.tokens
    eos = tok.eos_token_id
    for start, end in corpus.doc_spans:  # every document is followed by EOS
        assert int(corpus.tokens[end]) == eos and eos not in corpus.tokens[start:end].tolist()


def test_builtin_sources():
    files = stdlib_files()
    assert any(f.name == "functools.py" for f in files) and all("site-packages" not in f.parts for f in files)
    from hyspec.train.data import humaneval_prompts

    prompts = humaneval_prompts()
    assert len(prompts) == 164 and prompts[0].startswith("from typing import List")


def test_token_cap_reads_a_seeded_sample(tok, corpus_dir):
    full = load_corpus([str(corpus_dir)], tok)
    capped = load_corpus([str(corpus_dir)], tok, max_tokens=50, seed=3)
    assert capped.stats.truncated and capped.stats.tokens < full.stats.tokens
    assert torch.equal(capped.tokens, load_corpus([str(corpus_dir)], tok, max_tokens=50, seed=3).tokens)


@pytest.mark.parametrize("make, message", [
    (lambda p: None, "does not exist"),
    (lambda p: p.mkdir(), "holds no"),
    (lambda p: (p.mkdir(), (p / "a.txt").write_text("")), "has no tokens"),
    (lambda p: p.write_text('{"text": "ok"}\n{"title": 3}\n'), ":2: a JSON object"),
    (lambda p: p.write_text('{"text": "ok"}\nnot json\n'), ":2: not valid JSON"),
])
def test_bad_data_is_named(tok, tmp_path, make, message):
    path = tmp_path / "data.jsonl"
    make(path)
    with pytest.raises(HyspecError, match=message):
        load_corpus([str(path)], tok)


@pytest.mark.parametrize("n, windows", [(70, 3), (65, 2), (64, 2)])
def test_windows_mask_the_last_position_and_pad_the_tail(n, windows):
    corpus = Corpus(tokens=torch.arange(10, 10 + n), doc_spans=[(0, n)], pad_id=0, stats=DataStats(["x"]))
    w = pack_windows(corpus, 32)
    assert len(w) == windows and w.seq_len == 32 and corpus.stats.windows == windows
    assert torch.equal(w.ids.flatten()[: min(n, 32 * windows)], corpus.tokens[: 32 * windows])
    assert not w.loss_mask[:, -1].any() and w.loss_mask[:2, :-1].all()
    if n % 32 >= 2:  # a padded tail window counts only its real predictions
        assert int(w.loss_mask[-1].sum()) == n % 32 - 1 and (w.ids[-1, n % 32:] == 0).all()


def test_batches_are_a_function_of_seed_and_step():
    a, b = BatchSampler(10, 4, seed=1), BatchSampler(10, 4, seed=1)
    steps = [a.indices(s).tolist() for s in range(5)]
    assert [b.indices(s).tolist() for s in reversed(range(5))] == steps[::-1]  # any order, same answer
    flat = [i for s in steps for i in s]
    # each epoch is a permutation of the windows
    assert sorted(flat[:10]) == list(range(10)) and sorted(flat[10:20]) == list(range(10))
    assert [BatchSampler(10, 4, seed=2).indices(s).tolist() for s in range(5)] != steps


def test_prompts_stay_inside_one_document(tok, corpus_dir):
    corpus = load_corpus([str(corpus_dir)], tok)
    prompts = sample_prompts(corpus, 40, 12, seed=0)
    assert prompts == sample_prompts(corpus, 40, 12, seed=0)
    eos = tok.eos_token_id
    for p in prompts:
        assert 1 <= len(p) <= 12 and eos not in p
