"""Run the conformance suite on this node's backends and print a per-op, per-method report.

Every op of each backend's op table is checked against the pure-torch
reference within the tolerance table of docs/conformance.md (ragged batches,
trees, page boundaries, GQA ratios); every drafting method in this build must
decode greedily exactly like plain decoding, with the KV pool clean after each
run; speculative sampling must reproduce the target's distribution
(statistical test); on the CPU the ONNX Runtime drafter must match the torch
one.  Without a CUDA device the Triton kernels run under TRITON_INTERPRET=1.

Exit status: 0 when every check that ran passed, 1 when one failed, 2 when a
backend asked for by name cannot run here (the report says why).
"""
from __future__ import annotations

import argparse
import sys

# no torch at import: `hyspec --help` must stay fast and work where torch is broken

BACKENDS = ("cpu", "cuda", "npu", "all")
PARTS = ("ops", "methods", "statistical", "onnx_drafter")  # hyspec.conformance.runner.PARTS


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--backend", choices=BACKENDS, default="all",
                        help="which backend to check (default: all; those that cannot run here are reported "
                             "as skipped)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON (schema: docs/conformance.md)")
    parser.add_argument("--quick", action="store_true",
                        help="fewer cases per op and shorter generations (every op, dtype and scenario still "
                             "runs; under the Triton interpreter the methods shrink to plain decoding)")
    parser.add_argument("--only", metavar="PART", nargs="+", choices=PARTS, default=None,
                        help=f"run only these parts ({', '.join(PARTS)})")
    parser.add_argument("--model", default=None, metavar="PATH",
                        help="run the drafting methods on this target (checkpoint directory, .gguf file, or "
                             "'default' for the default model) instead of the tiny target written for the run; "
                             "drafters are random, built for it")
    parser.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default=None,
                        help="dtype of the drafting methods' engines (default: float32 on the CPU, bfloat16 on "
                             "accelerators)")
    parser.add_argument("--cases", action="store_true", help="list every case in the table, not only failures")


def run(args: argparse.Namespace) -> int:
    # hyspec.conformance brings torch: imported once the command runs
    # (`hyspec --help` imports every cli module: build_parser; this keeps it torch-free)
    from hyspec.conformance import run_conformance

    progress = None if args.json else (lambda message: print(f"... {message}", file=sys.stderr, flush=True))
    report = run_conformance(args.backend, quick=args.quick, parts=tuple(args.only or PARTS), progress=progress,
                             model=args.model, dtype=args.dtype)
    print(report.to_json() if args.json else report.format(verbose=args.cases))
    missing = [b for b in report.backends if not b.available]
    if args.backend != "all" and missing:
        print(f"hyspec conformance: error: backend {args.backend!r} cannot run here: {missing[0].reason}",
              file=sys.stderr)
        return 2
    return 0 if report.passed else 1
