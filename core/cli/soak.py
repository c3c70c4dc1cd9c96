"""Soak test of `hyspec serve`: concurrent streaming clients for a long time, a remote draft worker killed midway.

    hyspec soak --duration 1200 --clients 32 --json soak.json
    hyspec soak --duration 60 --clients 8      # a quick look

Starts `hyspec serve` (a subprocess, remote drafting on a local Ray instance), runs the load test's checked
clients (hyspec load-test), SIGKILLs the Ray draft worker at --kill-worker-at, samples resident memory, then
stops the server with SIGTERM and requires exit status 0 (what is reported: hyspec.bench.soak).  Needs the
dist and serve extras.  Exit status 0 only if nothing was wrong.
"""
from __future__ import annotations

import argparse
import json

#: ngram drafted on a remote Ray worker; after the worker is killed the server fails over to local ngram
DEFAULT_SPEC = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 3,
                "draft_placement": "remote",
                "remote": {"draft_deadline_ms": 200, "ping_interval_ms": 200, "max_missed_pings": 3}}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("--model", help="model to serve (default: the embedded default model)")
    parser.add_argument("--speculative-config", default=json.dumps(DEFAULT_SPEC),
                        help="JSON (default: ngram drafted on a remote Ray worker, local ngram after failover)")
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--duration", type=float, default=1200.0, help="seconds during which clients start requests")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--num-prompts", type=int, default=64, help="distinct prompts the clients cycle through")
    parser.add_argument("--kill-worker-at", type=float, default=None,
                        help="seconds into the load to SIGKILL the draft worker (default: a quarter in; <0: never)")
    parser.add_argument("--rss-interval", type=float, default=5.0)
    parser.add_argument("--warm-up-s", type=float, default=60.0, help="RSS growth is measured from this time on")
    parser.add_argument("--json", metavar="PATH")
    parser.add_argument("--log", metavar="PATH", help="the server's log (default: beside --json, or a temp file)")


def run(args: argparse.Namespace) -> int:
    from hyspec.bench.soak import run_soak  # httpx: the serve extra

    return run_soak(args)
