"""Build the suffix corpus for the default model from the target's own answers (assets/smollm2-suffix-corpus).

    .venv/bin/python scripts/build_suffix_corpus.py [--selfgen .bench-work/drafter-data/selfgen.pt]
        [--rows all|greedy] [--out assets/smollm2-suffix-corpus]

The answers are the drafters' training data (scripts/train_default_drafters.sh writes them: the default
model's answers, greedy for even prompts and sampled at 0.7 for odd ones, to instructions built from the
Python standard library by scripts/build_drafter_prompts.py; nothing from HumanEval, the benchmark).  Each
corpus sequence is one window: the prompt as the chat template renders it, then the answer, cut where the
window's generated tokens end.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def windows_to_sequences(ids, loss_mask, rows: str) -> list[list[int]]:
    """Each window's prompt and answer (padding dropped); ``rows="greedy"`` keeps the even (greedy) rows."""
    sequences, index = [], 0  # index: the prompt's, across chunks (its parity is its temperature's)
    for chunk_ids, chunk_mask in zip(ids, loss_mask):
        for row, mask in zip(chunk_ids.tolist(), chunk_mask.tolist()):
            counted = [t for t, m in enumerate(mask) if m]
            if counted and (rows == "all" or index % 2 == 0):
                sequences.append(row[: counted[-1] + 2])  # position t predicts t + 1: one past the last
            index += 1
    return sequences


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--selfgen", default=".bench-work/drafter-data/selfgen.pt")
    ap.add_argument("--prompts-manifest", default=".bench-work/drafter-data/prompts.manifest.json")
    ap.add_argument("--rows", choices=("all", "greedy"), default="all")
    ap.add_argument("--out", default="assets/smollm2-suffix-corpus")
    args = ap.parse_args(argv)
    import torch

    from hyspec.assets import default_model
    from hyspec.drafters.suffix.corpus import save_corpus
    from hyspec.model.tokenizer import Tokenizer

    data = torch.load(args.selfgen, weights_only=True)
    seqs = windows_to_sequences(data["ids"], data["loss_mask"], args.rows)
    manifest_path = Path(args.prompts_manifest)
    prompts = json.loads(manifest_path.read_text()) if manifest_path.is_file() else None
    recipe = {"source": "the default model's answers cached by scripts/train_default_drafters.sh (selfgen.pt)",
              "selfgen_key": data["key"], "windows": sum(len(c) for c in data["ids"]), "rows": args.rows,
              "temperatures": "greedy for even prompt indices, 0.7 for odd ones", "seq_len": 320,
              "prompt_len": 192, "prompts": prompts, "benchmark_data": "none (no HumanEval)",
              "built_by": "scripts/build_suffix_corpus.py"}
    out = save_corpus(args.out, seqs, Tokenizer(default_model()), recipe)
    print(f"{len(seqs)} sequences, {sum(map(len, seqs))} tokens -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
