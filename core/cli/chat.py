"""Chat with the model over its chat template, streaming the answer as it is generated.

Interactive by default (type a message, Enter; ``/reset`` forgets the
conversation, ``/exit`` or Ctrl-D ends).  ``--message TEXT`` (repeatable) runs
those turns and exits, and lines piped on standard input are turns too::

    hyspec chat
    hyspec chat --message 'Write a Python function that checks whether a number is prime.'
    hyspec chat --speculative-config '{"method": "ngram"}' < questions.txt

Greedy (temperature 0) unless --temperature says otherwise, so an answer can be
reproduced; every speculative method gives the same tokens as plain decoding.
"""
from __future__ import annotations

import argparse
import sys
import time
from typing import Any, Iterator, TextIO

from hyspec.cli.model_args import add_engine_arguments, add_model_arguments, model_kwargs
from hyspec.errors import HyspecError, RequestError

PROMPT = "you> "


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_arguments(parser)
    parser.add_argument("--message", action="append", default=[], metavar="TEXT",
                        help="a user turn to answer, then exit (repeat for several turns)")
    parser.add_argument("--system", default=None, metavar="TEXT",
                        help="a system message (default: the chat template's own, if it has one)")
    parser.add_argument("--max-tokens", type=int, default=512, help="most tokens per answer (default 512)")
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--top-k", type=int, default=0)
    parser.add_argument("--seed", type=int, default=None)
    add_engine_arguments(parser)
    parser.add_argument("--no-stats", action="store_true", help="do not print tokens and speed after each answer")


def stream_answer(llm: Any, messages: list[dict[str, str]], params: Any) -> Iterator[tuple[str, Any]]:
    """Yield ``(new text, output)`` as the engine produces the answer to ``messages``."""
    tok = llm.tokenizer
    text = tok.apply_chat_template(messages, add_generation_prompt=True)
    engine = llm.engine
    seq = engine.add_request({"prompt": text, "prompt_token_ids": tok.encode(text, add_special_tokens=False)}, params)
    try:
        while True:
            for out in engine.step():
                if out.request_id != seq.request_id:
                    continue
                yield out.new_text, out
                if out.finished:
                    return
    finally:
        if engine.has_unfinished_requests():
            engine.abort_request(seq.request_id)  # Ctrl-C mid-answer: free its KV, keep the engine usable


def _turns(args: argparse.Namespace, stdin: TextIO) -> Iterator[str]:
    if args.message:
        yield from args.message
        return
    interactive = stdin.isatty()
    while True:
        if interactive:
            print(PROMPT, end="", flush=True, file=sys.stderr)
        line = stdin.readline()
        if not line:
            if interactive:
                print(file=sys.stderr)
            return
        line = line.strip()
        if line:
            yield line


def run(args: argparse.Namespace) -> int:
    # hyspec.LLM brings torch: imported once the command runs
    # (`hyspec --help` imports every cli module: build_parser; this keeps it torch-free)
    from hyspec import LLM, SamplingParams

    if args.max_tokens <= 0:
        raise HyspecError(f"--max-tokens must be positive, got {args.max_tokens}")
    params = SamplingParams(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, seed=args.seed,
                            max_tokens=args.max_tokens)
    llm = LLM(args.model, **model_kwargs(args))
    if not llm.tokenizer.chat_template:
        raise HyspecError("this model has no chat template; use `hyspec generate --prompt TEXT`")
    system = [{"role": "system", "content": args.system}] if args.system else []
    history: list[dict[str, str]] = []
    for turn in _turns(args, sys.stdin):
        if turn in ("/exit", "/quit"):
            break
        if turn == "/reset":
            history.clear()
            print("(conversation reset)", file=sys.stderr)
            continue
        messages = system + history + [{"role": "user", "content": turn}]
        t0 = time.perf_counter()
        answer, out = [], None
        try:
            for delta, out in stream_answer(llm, messages, params):
                answer.append(delta)
                sys.stdout.write(delta)
                sys.stdout.flush()
        except RequestError as exc:  # the conversation outgrew the context: say so and keep the session
            print(f"hyspec chat: {exc}; /reset starts a new conversation", file=sys.stderr)
            continue
        print()
        history += [{"role": "user", "content": turn}, {"role": "assistant", "content": "".join(answer)}]
        if not args.no_stats and out is not None:
            n = len(out.outputs[0].token_ids)
            seconds = time.perf_counter() - t0
            print(f"--- {n} tokens in {seconds:.2f}s ({n / max(seconds, 1e-9):.1f} tok/s), "
                  f"finish_reason={out.outputs[0].finish_reason}", file=sys.stderr)
    return 0
