"""Write the self-distillation prompts the default model's drafters are trained on (assets/DRAFTERS.md).

    python scripts/build_drafter_prompts.py --count 3000 --seed 0 --out .bench-work/drafter-data/prompts.jsonl

The prompts come from the running interpreter's standard library, its reference documentation
(pydoc_data.topics) and the general-question templates of hyspec.train.instructions -- never from
HumanEval, the benchmark.  A manifest beside the JSONL records the recipe: count, seed, Python version,
how many prompts of each kind.
"""
from __future__ import annotations

import argparse
import collections
import json
import platform
import sys
import sysconfig
from pathlib import Path

from hyspec.train.instructions import KIND_WEIGHTS, build_prompts, write_prompts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=3000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    records = build_prompts(args.count, seed=args.seed)
    write_prompts(args.out, records)
    kinds = collections.Counter(r["kind"] for r in records)
    manifest = {"count": args.count, "seed": args.seed, "python": platform.python_version(),
                "stdlib": sysconfig.get_paths()["stdlib"], "kind_weights": KIND_WEIGHTS, "kinds": dict(sorted(kinds.items())),
                "builder": "hyspec.train.instructions.build_prompts"}
    args.out.with_suffix(".manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    print(f"wrote {len(records)} prompts to {args.out}: {dict(sorted(kinds.items()))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
