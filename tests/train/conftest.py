from __future__ import annotations

import json
import sysconfig
from pathlib import Path

import pytest

from tests.model.tiny_checkpoint import make_checkpoint



@pytest.fixture(scope="session")
def target_dir(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("train_target")
    make_checkpoint(path, "llama_gqa", layers=2, seed=0)
    return path


@pytest.fixture(scope="session")
def corpus_dir(tmp_path_factory) -> Path:
    """A small code corpus: three standard-library modules (stable for a given Python), a note, a jsonl file."""
    path = tmp_path_factory.mktemp("train_corpus")
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    for name in ("bisect.py", "colorsys.py", "keyword.py"):
        (path / name).write_text((stdlib / name).read_text())
    (path / "notes.md").write_text("# notes\n\nDraft models propose; the target verifies.\n")
    (path / "extra.jsonl").write_text("\n".join(json.dumps(r) for r in [
        {"text": "def square(x):\n    return x * x\n"}, {"prompt": "for i in range(10):\n    print(i)\n"}]))
    return path


def small_config(target_dir: Path, data: Path, out: Path, **kw):
    """A draft_model run that takes a second or two on one core."""
    from hyspec.train.trainer import TrainConfig

    base = dict(method="draft_model", target=target_dir, data=[str(data)], out=out, steps=12, batch_size=4,
                seq_len=32, lr=3e-3, warmup=2, seed=0, options={"hidden_size": 32, "layers": 1},
                checkpoint_every=4, log_every=1, progress=False, precision="fp32")
    base.update(kw)
    return TrainConfig(**base)
