"""A tiny target and a random draft_model drafter (a plain HF Llama checkpoint) for the bench tests."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

#: the goodput controller times steps (noise on a shared box) and profiles at start-up: off, tests are about
#: what the benchmark reports, not when speculation pays
CONTROLLER_OFF = json.dumps({"controller": {"enabled": False, "profile_at_startup": False}})
# the tiny target's greedy continuations of the first two repeat themselves within 8 tokens: ngram drafts
PROMPTS = ["import os\nimport os\nimport", "for i in range(10):\n    for i in range(",
           "def add(a, b):\n    return a + b\n\ndef add(a, b):", "x = [1, 2, 3]\ny = [1, 2,"]




@pytest.fixture(scope="session")
def tiny(tmp_path_factory) -> dict[str, Path]:
    """{"target", "draft_model", "prompts"}: a 2-layer target, a 1-layer random drafter, a JSONL prompt file."""
    from hyspec.model.loader import load_model
    from hyspec.train.registry import resolve_recipe
    from tests.model.tiny_checkpoint import make_checkpoint

    root = tmp_path_factory.mktemp("bench")
    target = root / "target"
    make_checkpoint(target, "llama_gqa", layers=2, seed=0)
    drafter = root / "draft_model"
    drafter.mkdir()
    recipe = resolve_recipe("draft_model")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = recipe.build(load_model(target, dtype="float32"), {"layers": 1, "hidden_size": 32})
    recipe.save(model.eval(), target, drafter)
    prompts = root / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    return {"target": target, "draft_model": drafter, "prompts": prompts, "root": root}


def bench_args(tiny: dict[str, Path], *extra: str, max_tokens: int = 12) -> list[str]:
    """A fast `hyspec bench` command line on the tiny target (append options with ``extra``)."""
    return ["bench", "--model", str(tiny["target"]), "--prompts", str(tiny["prompts"]), "--num-prompts", "2",
            "--max-tokens", str(max_tokens), "--repeats", "2", "--batch-sizes", "1", "--kv-cache-bytes",
            str(8 << 20), "--bandwidth-bytes", str(1 << 20), "--speculative-config-extra", CONTROLLER_OFF,
            "--no-progress", *extra]
