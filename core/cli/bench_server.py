"""Server throughput with and without speculation: `hyspec serve` processes under concurrent streaming clients.

    hyspec bench-server --tiny --duration 3 --clients 1,4      # development, random tiny models
    hyspec bench-server --duration 30 --json server.json      # the embedded default model
    hyspec bench-server --rounds 4 --duration 15              # servers side by side, cells alternated
    hyspec bench-server --model DIR --speculative-config hybrid.json --configs plain,hybrid,eagle

Per configuration and client count: tokens/s, TTFT and TPOT p50/p99 as the clients saw them, the speed-up
over plain, the dispatcher's decisions and decision latency from /metrics, and each prompt's first greedy
output compared with plain's (what it measures: hyspec.bench.server_bench).  Exit status 0 when every
configuration ran without errors, 1 otherwise, 2 for bad options.
"""
from __future__ import annotations

import argparse
import os

from hyspec.errors import ConfigError


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    where = p.add_mutually_exclusive_group()
    where.add_argument("--model", help="target model directory (default: the embedded default model)")
    where.add_argument("--tiny", action="store_true", help="tiny random target + draft model (development only)")
    p.add_argument("--configs", default="plain,hybrid,ngram",
                   help="comma list: plain, hybrid, or a method run alone (default plain,hybrid,ngram)")
    p.add_argument("--speculative-config", metavar="JSON|PATH", help="the hybrid configuration (default: hybrid over "
                   "ngram and every drafter found, with the built-in rules; --tiny: its own rules)")
    p.add_argument("--config", action="append", default=[], metavar="NAME=JSON|PATH",
                   help="speculative_config of configuration NAME (overrides the default; repeatable)")
    p.add_argument("--clients", default="1,4,16,32", help="comma list of concurrent clients (default 1,4,16,32)")
    p.add_argument("--duration", type=float, default=20.0, help="seconds of load per client count (default 20)")
    p.add_argument("--rounds", type=int, default=1,
                   help="> 1: start every configuration's server at once and alternate them, this many rounds of "
                        "--duration per client count (drift on a shared machine then hits all alike)")
    p.add_argument("--max-tokens", type=int, default=64, help="tokens per request (default 64)")
    p.add_argument("--num-prompts", type=int, default=64, help="distinct prompts cycled by the clients (default 64)")
    p.add_argument("--max-prompt-tokens", type=int, default=1024, help="left-truncate longer prompts (default 1024)")
    p.add_argument("--prompts", metavar="FILE", help="JSONL or text prompts (default: HumanEval; --tiny: snippets)")
    p.add_argument("--num-speculative-tokens", type=int, default=4)
    p.add_argument("--backend", default="auto")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--max-num-seqs", type=int, default=64, help="server batch limit (default 64; >= max clients)")
    p.add_argument("--max-model-len", type=int)
    p.add_argument("--kv-cache-bytes", help="server KV cache size, e.g. 2GiB (default: the server's)")
    p.add_argument("--startup-timeout", type=float, default=900.0, help="seconds to wait for a server (default 900)")
    p.add_argument("--json", metavar="PATH", help="write the results here (default: bench_server.json in the log dir)")
    p.add_argument("--log-dir", metavar="DIR", help="server logs (default: a new temporary directory)")


def check_arguments(args: argparse.Namespace) -> argparse.Namespace:
    """Split the comma lists, check the numbers, fill --tiny's defaults; a bad option is a ConfigError naming it."""
    if isinstance(args.configs, str):
        args.configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    if isinstance(args.clients, str):
        try:
            args.clients = [int(c) for c in args.clients.split(",")]
        except ValueError:
            raise ConfigError("--clients", f"expected a comma list of integers, got {args.clients!r}") from None
    if not args.clients or min(args.clients) < 1:
        raise ConfigError("--clients", "every count must be >= 1")
    if max(args.clients) > args.max_num_seqs:
        raise ConfigError("--max-num-seqs", f"{args.max_num_seqs} is below {max(args.clients)} clients: "
                                            "requests would queue")
    if args.duration <= 0 or args.max_tokens < 1 or args.num_prompts < 1 or args.rounds < 1:
        raise ConfigError("--duration", "--duration, --max-tokens, --num-prompts and --rounds must be positive")
    if args.tiny:
        args.dtype = "float32" if args.dtype == "auto" else args.dtype
        args.kv_cache_bytes = args.kv_cache_bytes or "64MiB"
    return args


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The options as ``hyspec bench-server`` takes them; a bad one exits 2 with its message (argparse's way)."""
    parser = argparse.ArgumentParser(prog="hyspec bench-server", description=__doc__)
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return check_arguments(args)
    except ConfigError as exc:
        parser.error(str(exc))


def run(args: argparse.Namespace) -> int:
    check_arguments(args)
    # the child servers' tokenizers: no thread pool each, on a machine the clients share with them
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from hyspec.bench.server_bench import run_bench_server  # httpx: the serve extra

    return run_bench_server(args)
