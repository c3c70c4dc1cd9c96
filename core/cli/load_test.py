"""Load test of a hyspec server: concurrent streaming clients, every stream checked against the request run alone.

    hyspec load-test --tiny                                  # a tiny random checkpoint, served in this process
    hyspec load-test --model DIR --clients 64 --duration 30
    hyspec load-test --url http://127.0.0.1:8000 --api-key KEY

Each stream must be well-formed SSE ending in [DONE], carry exactly --max-tokens token ids and equal the
same request run alone (temperature 0); afterwards nothing may be in flight and the KV pool must be empty.
Prints a JSON report; exit status 0 only if all held (hyspec.bench.server_load).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--url", help="an already running server")
    where.add_argument("--model", help="serve this model directory in-process on 127.0.0.1")
    where.add_argument("--tiny", action="store_true",
                       help="write the conformance suite's tiny random checkpoint and serve it")
    parser.add_argument("--served-model-name", help="`model` to send (default: none, the server's only model)")
    parser.add_argument("--api-key")
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--duration", type=float, default=10.0, help="seconds during which clients start requests")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--kv-cache-bytes", type=int, default=64 << 20, help="with --model/--tiny")
    parser.add_argument("--json", metavar="PATH", help="also write the report here")


def run(args: argparse.Namespace) -> int:
    # httpx and the server stack come with the serve extra: imported once the command runs
    from hyspec.bench.server_load import run_load

    if args.url:
        report = asyncio.run(run_load(args.url, args.clients, args.duration, args.max_tokens,
                                      args.served_model_name, args.api_key))
    else:
        from hyspec.server.app import create_app
        from hyspec.server.launcher import BackgroundServer

        model_dir = args.model or _tiny_checkpoint()
        app = create_app({"model": model_dir, "kv_cache_bytes": args.kv_cache_bytes, "max_num_seqs": args.clients},
                         max_queue=args.clients)
        with BackgroundServer(app) as server:
            report = asyncio.run(run_load(server.url, args.clients, args.duration, args.max_tokens))
    text = json.dumps(report.to_dict(), indent=2)
    print(text)
    if args.json:
        Path(args.json).write_text(text)
    return 0 if report.ok else 1


def _tiny_checkpoint() -> str:
    # hyspec.conformance.tiny brings torch: imported when asked for
    # (`hyspec --help` imports every cli module: build_parser; this keeps it torch-free)
    from hyspec.conformance.tiny import make_tiny_target

    return str(make_tiny_target(Path(tempfile.mkdtemp(prefix="hyspec-load-")) / "tiny"))
