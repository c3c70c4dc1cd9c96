"""Run the OpenAI-compatible server (/v1/completions, /v1/chat/completions, /v1/models, /health, /metrics).

Binds 127.0.0.1 unless --host says otherwise.  SIGINT/SIGTERM shut it down
gracefully: new requests get 503, in-flight ones finish (up to
--shutdown-timeout seconds), then the engine stops.  Needs the serve extra:
pip install 'hyspec[serve]'.

`hyspec serve MODEL` takes vLLM's flags where hyspec has the feature (--gpu-memory-utilization,
--served-model-name A B, --seed, --chat-template, -tp 1, ...) and refuses the others with the reason
(--tensor-parallel-size 2, --trust-remote-code, ...): every one is listed in docs/vllm_compat.md.
"""
from __future__ import annotations

import argparse
import ipaddress
import logging
import os
import sys
from pathlib import Path

from hyspec.assets import default_model
from hyspec.cli.model_args import byte_size  # noqa: F401  (hyspec serve's size parser, tested from here)
from hyspec.cli.model_args import (add_engine_arguments, add_model_arguments, model_kwargs, model_path,
                                   non_negative_int, positive_int)
from hyspec.engine.vllm_args import normalize_dtype
from hyspec.errors import HyspecError

# No torch (nor fastapi) at import: `hyspec --help` and the probe's TORCH_DEVICE_BACKEND_AUTOLOAD fix
# must run before anything imports torch.  Everything heavy is imported inside run().

log = logging.getLogger(__name__)

_SERVE_MODULES = {"fastapi", "uvicorn", "prometheus_client", "starlette", "pydantic"}
API_KEY_VARIABLES = ("HYSPEC_API_KEY", "VLLM_API_KEY")


def _port(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"a TCP port is 0-65535, got {value}")
    return value


def _seconds(text: str) -> float:
    value = float(text)
    if not 0.0 <= value < float("inf"):  # also refuses nan
        raise argparse.ArgumentTypeError(f"must be a number of seconds >= 0, got {text}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_arguments(parser, positional=True)
    parser.add_argument("--served-model-name", nargs="+", metavar="NAME",
                        help="the names clients may pass as `model`; the first is the one reported (default: the "
                             "model directory's name)")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    parser.add_argument("--port", type=_port, default=8000, help="TCP port (default 8000)")
    parser.add_argument("--api-key", nargs="+", default=_key_from_environment(), metavar="KEY",
                        help="require 'Authorization: Bearer KEY' on /v1/* and /openapi.json (and turn /docs off). "
                             "A key on the command line is visible to other local users (ps, /proc): prefer the "
                             "environment variable HYSPEC_API_KEY or VLLM_API_KEY (none if unset)")
    parser.add_argument("--allowed-hosts", metavar="HOST[,HOST...]",
                        help="names the Host header may carry, e.g. api.example.com,*.corp, or * for any; others get "
                             "400, so that a DNS-rebinding web page cannot drive the server (default: when bound to "
                             "loopback, the --host plus localhost, 127.0.0.1 and [::1]; otherwise any)")
    parser.add_argument("--protect-metrics", action="store_true", help="require the API key on /metrics too")
    parser.add_argument("--seed", type=int, default=None,
                        help="seed the generators that sample requests without a seed of their own (vLLM's --seed)")
    parser.add_argument("--chat-template", metavar="FILE|TEMPLATE",
                        help="the chat template to render chat requests with: a Jinja file, or the template text "
                             "(default: the model's own)")
    parser.add_argument("--disable-fastapi-docs", action=argparse.BooleanOptionalAction, default=False,
                        help="turn /docs, /redoc and /openapi.json off (they are off anyway with an API key)")
    parser.add_argument("--max-queue", type=non_negative_int, default=256, metavar="N",
                        help="requests that may wait beyond the running batch; more get 429 (default 256)")
    parser.add_argument("--max-tokens", type=positive_int, default=None, metavar="N",
                        help="most tokens one request may generate: more is a 400 naming this limit, and a request "
                             "that asks for no limit (chat without max_tokens) gets N (default: the context length)")
    parser.add_argument("--max-prompt-chars", type=positive_int, default=None, metavar="N",
                        help="most characters of prompt text (all prompts, or all chat messages) in one request, "
                             "refused with a 400 before tokenizing (default: 64 per token of --max-model-len)")
    parser.add_argument("--max-n", type=positive_int, default=None, metavar="N",
                        help="most completions per prompt (n, best_of) one request may ask for; more get 400 "
                             "(default: a quarter of --max-num-seqs, at least 1)")
    parser.add_argument("--split-special-tokens-in-content", action=argparse.BooleanOptionalAction, default=True,
                        help="tokenize control-token text (<|im_start|>) in chat content of other roles than system "
                             "and developer as text, so that a user cannot write a turn of another role (default: on)")
    parser.add_argument("--shutdown-timeout", type=_seconds, default=30.0, metavar="SECONDS",
                        help="how long in-flight requests may run after SIGTERM before they are aborted (default 30)")
    parser.add_argument("--log-level", "--uvicorn-log-level", default="info",
                        choices=["critical", "error", "warning", "info", "debug", "trace"])
    add_engine_arguments(parser, server=True)


def engine_args(args: argparse.Namespace) -> dict:
    """LLMEngine keyword arguments (with ``model``) from parsed arguments."""
    model = model_path(args)
    if model is None:
        model = str(default_model())
    kwargs = model_kwargs(args)
    kwargs["dtype"] = normalize_dtype(kwargs["dtype"])
    return {"model": model, **kwargs}


def _key_from_environment() -> str | None:
    return next((os.environ[name] for name in API_KEY_VARIABLES if os.environ.get(name)), None)


def api_key(args: argparse.Namespace) -> str | None:
    """--api-key, else $HYSPEC_API_KEY or $VLLM_API_KEY (both set and different: an error)."""
    if isinstance(args.api_key, list):  # given on the command line (the environment's is the default, a str)
        if len(args.api_key) > 1:
            raise HyspecError(f"--api-key: hyspec serve takes one key, got {len(args.api_key)} values (a MODEL "
                              "written after --api-key is read as a key: put MODEL first)")
        return args.api_key[0]
    found = {name: os.environ[name] for name in API_KEY_VARIABLES if os.environ.get(name)}
    if len(set(found.values())) > 1:
        raise HyspecError(f"{' and '.join(found)} are both set, to different keys: unset one")
    return args.api_key


def chat_template(value: str | None) -> str | None:
    """--chat-template: a file's text, or the value itself when it looks like a template (as vLLM reads it)."""
    if value is None:
        return None
    path = Path(value).expanduser()
    if path.is_file():
        return path.read_text(encoding="utf-8")
    if any(mark in value for mark in ("{{", "{%")):
        return value
    raise HyspecError(f"--chat-template: {value!r} is neither a file nor a Jinja template")


def run(args: argparse.Namespace) -> int:
    try:
        from hyspec.engine.vllm_args import apply_seed
        from hyspec.server.app import create_app
        from hyspec.server.launcher import run_server
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.split(".")[0] in _SERVE_MODULES:
            print(f"hyspec serve: error: {exc.name} is not installed; install the server extra with "
                  "`pip install 'hyspec[serve]'`", file=sys.stderr)
            return 2
        raise
    key = api_key(args)
    template = chat_template(args.chat_template)
    if not _is_loopback(args.host) and not key:
        log.warning("serving on %s without an API key: anyone who can reach this address can use it", args.host)
    apply_seed(args.seed)
    app = create_app(engine_args(args), api_key=key, served_model_name=args.served_model_name,
                     chat_template=template, docs=not args.disable_fastapi_docs,
                     max_queue=args.max_queue, protect_metrics=args.protect_metrics,
                     drain_timeout=args.shutdown_timeout, max_tokens=args.max_tokens,
                     max_prompt_chars=args.max_prompt_chars, max_n=args.max_n,
                     split_special_tokens_in_content=args.split_special_tokens_in_content,
                     allowed_hosts=allowed_hosts(args))
    print(f"hyspec serve: serving {app.state.served_model_name!r} on http://{args.host}:{args.port}/v1",
          file=sys.stderr, flush=True)
    run_server(app, host=args.host, port=args.port, shutdown_timeout=args.shutdown_timeout,
               log_level=args.log_level)
    print("hyspec serve: stopped", file=sys.stderr)
    return 0


def allowed_hosts(args: argparse.Namespace) -> list[str]:
    """--allowed-hosts, or the default: the loopback names for a loopback bind, any host otherwise (a server
    bound to other addresses is reached by names only its operator knows; its guard is the API key)."""
    if args.allowed_hosts:
        return [h.strip() for h in args.allowed_hosts.split(",") if h.strip()]
    if not _is_loopback(args.host):
        return ["*"]
    served = f"[{args.host}]" if ":" in args.host else args.host
    return [served, *(h for h in ("localhost", "127.0.0.1", "[::1]") if h != served)]


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
