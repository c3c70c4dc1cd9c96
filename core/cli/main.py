"""``hyspec`` command line: one subcommand per module of hyspec.cli, listed in COMMANDS below."""
from __future__ import annotations

import argparse
import importlib
import logging
import sys

from hyspec import __version__
from hyspec.errors import HyspecError
from hyspec.spec.registry import trainable_methods

# subcommand -> (module under hyspec.cli, one-line help)
COMMANDS = {
    "probe": ("probe", "report what this node can run (backends, ops, drafting methods)"),
    "generate": ("generate", "generate text from prompts, with or without speculation"),
    "chat": ("chat", "chat with the model over its chat template, streaming the answer"),
    "bench": ("bench", "benchmark methods side by side with the tools users would pick instead"),
    "bench-server": ("bench_server", "server throughput with and without speculation under concurrent clients"),
    "load-test": ("load_test", "concurrent streaming clients against a server, every stream checked"),
    "soak": ("soak", "a long load test with a remote draft worker killed midway"),
    "serve": ("serve", "run the OpenAI-compatible server with Prometheus metrics"),
    "train-draft": ("train_draft", f"train a drafter ({', '.join(trainable_methods())}) for a target"),
    "conformance": ("conformance", "run the per-backend conformance suite and print a report"),
    "draft-worker": ("draft_worker", "run or join a remote CPU draft worker node (Ray)"),
    "export-hf": ("export_hf", "write a GGUF model as a Hugging Face directory (for vLLM, transformers)"),
    "export-drafter": ("export_drafter", "write a hyspec drafter (eagle3, draft_model) as vLLM loads it"),
    "convert": ("convert", "rewrite a pickled pytorch_model.bin checkpoint as safetensors (weights only)"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hyspec", description=__doc__)
    parser.add_argument("--version", action="version", version=f"hyspec {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log at DEBUG level")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module_name, help_text) in COMMANDS.items():
        module = importlib.import_module(f"hyspec.cli.{module_name}")
        p = sub.add_parser(name, help=help_text, description=(module.__doc__ or help_text).strip())
        module.add_arguments(p)
        p.set_defaults(_run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    if args.command is None:
        parser.print_help()
        return 2
    try:
        return int(args._run(args) or 0)
    except HyspecError as exc:
        print(f"hyspec {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
