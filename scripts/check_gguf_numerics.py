"""hyspec vs transformers on the default model's GGUF: greedy tokens and teacher-forced logits in fp32.

    .venv/bin/python scripts/check_gguf_numerics.py --json docs/results/DATE/gguf-vs-transformers.json

Both sides load the same file (transformers through ``gguf_file=``, with its own dequantizer); every
prompt is decoded greedily for --max-tokens tokens (EOS ignored), then both score hyspec's whole
sequence, so logits are compared at every generated position.  Prompts: chat turns through the chat
template and code heads (see hyspec.bench.vs_transformers; not HumanEval, the benchmark).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="a GGUF file or HF directory (default: the default model)")
    parser.add_argument("--chat", type=int, default=4, help="chat prompts (at most 6)")
    parser.add_argument("--code", type=int, default=4, help="code prompts (at most 4)")
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--json", type=Path, default=None, help="write the report here")
    args = parser.parse_args(argv)

    import torch

    from hyspec.assets import default_model
    from hyspec.bench.machine import machine_info
    from hyspec.backends.registry import get_backend
    from hyspec.bench.vs_transformers import compare

    torch.manual_seed(0)
    report = compare(args.model or default_model(), args.chat, args.code, args.max_tokens)
    report["machine"] = machine_info(get_backend("cpu"))
    import transformers

    report["versions"] = {"torch": torch.__version__, "transformers": transformers.__version__}
    for row in report["rows"]:
        print(f"{row['prompt'][:60]:<60}  {row['generated']:>4} tokens  identical={row['token_identical']}  "
              f"max|dlogit|={row['max_abs_logit_diff']:.2e}  (|logit| up to {row['max_abs_logit']:.1f})")
    print(f"{report['prompts']} prompts, {report['positions_compared']} positions: "
          f"token-identical={report['all_token_identical']}, max |logit diff| {report['max_abs_logit_diff']:.3e}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0 if report["all_token_identical"] else 1


if __name__ == "__main__":
    sys.exit(main())
