"""Generate text from prompts with the target model, with or without speculation.

Without --model the default model (SmolLM2-135M-Instruct, from its GGUF) is used.  Speculation is set
with --speculative-config (vLLM's JSON shape plus hyspec's keys), e.g.::

    hyspec generate --prompt 'def fibonacci(n):' --max-tokens 64 \\
        --speculative-config '{"method": "ngram", "num_speculative_tokens": 4}'
"""
from __future__ import annotations

import argparse
import json
import sys
import time

from hyspec.cli.model_args import add_engine_arguments, add_model_arguments, model_kwargs
from hyspec.errors import HyspecError

# no torch import at module level: `hyspec probe` must stay importable when torch itself is broken


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_arguments(parser)
    parser.add_argument("--prompt", action="append", default=[], help="a prompt (repeat for a batch)")
    parser.add_argument("--prompts-file", default=None, help="a text file with one prompt per line, or JSONL with 'prompt'")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--top-k", type=int, default=0)
    parser.add_argument("--min-p", type=float, default=0.0)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--stop", action="append", default=None, help="a stop string (repeatable)")
    add_engine_arguments(parser)
    parser.add_argument("--json", action="store_true", help="print one JSON object per prompt")


def _prompts(args: argparse.Namespace) -> list[str]:
    prompts = list(args.prompt)
    if args.prompts_file:
        try:
            with open(args.prompts_file, encoding="utf-8") as f:
                lines = [line.rstrip("\n") for line in f if line.strip()]
        except OSError as exc:
            raise HyspecError(f"--prompts-file: {exc}") from None
        for i, line in enumerate(lines, 1):
            if line.lstrip().startswith("{"):
                try:
                    prompts.append(json.loads(line)["prompt"])
                except (json.JSONDecodeError, KeyError, TypeError):
                    raise HyspecError(f"--prompts-file line {i}: expected JSON with a 'prompt' field") from None
            else:
                prompts.append(line.replace("\\n", "\n"))
    if not prompts:
        raise HyspecError("no prompt given: use --prompt TEXT or --prompts-file FILE")
    return prompts


def run(args: argparse.Namespace) -> int:
    # hyspec.LLM brings torch: imported once the command runs
    # (`hyspec --help` imports every cli module: build_parser; this keeps it torch-free)
    from hyspec import LLM, SamplingParams

    prompts = _prompts(args)
    params = SamplingParams(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, min_p=args.min_p,
                            seed=args.seed, max_tokens=args.max_tokens, stop=args.stop)
    llm = LLM(args.model, **model_kwargs(args))
    t0 = time.perf_counter()
    outputs = llm.generate(prompts, params)
    seconds = time.perf_counter() - t0
    n_tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
    for out in outputs:
        comp = out.outputs[0]
        if args.json:
            print(json.dumps({"prompt": out.prompt, "text": comp.text, "token_ids": comp.token_ids,
                              "finish_reason": comp.finish_reason}))
        else:
            print(f"{out.prompt}\033[1m{comp.text}\033[0m" if sys.stdout.isatty() else f"{out.prompt}{comp.text}")
            print(f"--- {len(comp.token_ids)} tokens, finish_reason={comp.finish_reason}")
    summary = f"{n_tokens} tokens in {seconds:.2f}s ({n_tokens / max(seconds, 1e-9):.1f} tok/s)"
    engine = llm.engine
    if engine.spec.enabled:
        t = engine.spec.metrics.snapshot()["totals"]
        if t["drafts"]:
            summary += (f", {t['accepted_tokens']}/{t['draft_tokens']} draft tokens accepted, "
                        f"mean acceptance length {1 + t['accepted_tokens'] / t['drafts']:.2f}")
    print(summary, file=sys.stderr)
    return 0
