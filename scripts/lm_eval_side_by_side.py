"""lm-eval's local-completions against `hyspec serve` beside lm-eval's hf backend, on the default model.

    python scripts/lm_eval_side_by_side.py --out docs/results/2026-12-01/lm_eval/plain.json
    python scripts/lm_eval_side_by_side.py --speculative-config '{"method": "eagle3", ...}' --out ....json

Both tasks of docs/lm_eval/tasks (all items unless --limit); fp32 on both sides.  Needs lm-eval[api].
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path

from hyspec.bench.vs_lm_eval import side_by_side


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=None, help="default: the default model's GGUF")
    ap.add_argument("--speculative-config", default=None, metavar="JSON")
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--work", type=Path, default=Path(".bench-work/lm_eval"))
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    if args.model is None:
        from hyspec.assets import default_model

        args.model = default_model()
    spec = json.loads(args.speculative_config) if args.speculative_config else None
    engine = {"dtype": "float32", "kv_cache_bytes": 256 << 20, "max_model_len": 2048, "max_num_seqs": 8}
    report = side_by_side(args.model, engine, args.work, limit=args.limit, speculative_config=spec)
    report["machine"] = {"cpu": _cpu_name(), "python": platform.python_version()}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps({k: v for k, v in report.items() if k not in ("rows", "generations")}, indent=1))
    return 0


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


if __name__ == "__main__":
    sys.exit(main())
