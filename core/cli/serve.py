"""Run the OpenAI-compatible server (/v1/completions, /v1/chat/completions, /v1/models, /health, /metrics).

Binds 127.0.0.1 unless --host says otherwise.  SIGINT/SIGTERM shut it down
gracefully: new requests get 503, in-flight ones finish (up to
--shutdown-timeout seconds), then the engine stops.  Needs the serve extra:
pip install 'hyspec[serve]'.
"""
from __future__ import annotations

import argparse
import ipaddress
import logging
import os
import re
import sys

from hyspec.assets import default_model
from hyspec.cli.model_args import add_model_arguments

# No torch (nor fastapi) at import: `hyspec --help` and the probe's TORCH_DEVICE_BACKEND_AUTOLOAD fix
# must run before anything imports torch.  Everything heavy is imported inside run().

log = logging.getLogger(__name__)

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?)b?\s*$", re.IGNORECASE)
_SERVE_MODULES = {"fastapi", "uvicorn", "prometheus_client", "starlette", "pydantic"}


def byte_size(text: str) -> int:
    """``"8388608"``, ``"8MiB"``, ``"2G"`` -> bytes (K/M/G/T are powers of 1024 with or without the i)."""
    m = _SIZE.match(text)
    if not m:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (examples: 536870912, 512MiB, 2G)")
    number, unit = float(m.group(1)), m.group(2).lower()
    value = int(number * 1024 ** " kmgt".index(unit or " "))
    if value <= 0:
        raise argparse.ArgumentTypeError(f"size must be positive, got {text!r}")
    return value


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


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


def _fraction(text: str) -> float:
    value = float(text)
    if not 0.0 < value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {value}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_arguments(parser)
    parser.add_argument("--served-model-name", metavar="NAME",
                        help="the name clients pass as `model` (default: the model directory's name)")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    parser.add_argument("--port", type=_port, default=8000, help="TCP port (default 8000)")
    parser.add_argument("--api-key", default=os.environ.get("HYSPEC_API_KEY"), metavar="KEY",
                        help="require 'Authorization: Bearer KEY' on /v1/* and /openapi.json (and turn /docs off). "
                             "A key on the command line is visible to other local users (ps, /proc): prefer the "
                             "environment variable HYSPEC_API_KEY, the default (none if unset)")
    parser.add_argument("--allowed-hosts", metavar="HOST[,HOST...]",
                        help="names the Host header may carry, e.g. api.example.com,*.corp, or * for any; others get "
                             "400, so that a DNS-rebinding web page cannot drive the server (default: when bound to "
                             "loopback, the --host plus localhost, 127.0.0.1 and [::1]; otherwise any)")
    parser.add_argument("--protect-metrics", action="store_true", help="require the API key on /metrics too")
    parser.add_argument("--speculative-config", metavar="JSON|PATH",
                        help="speculative decoding config: a JSON object or a path to a JSON file (vLLM's schema "
                             "plus hyspec's keys); default: plain decoding")
    parser.add_argument("--backend", default="auto", help="auto (NPU > CUDA > CPU), npu, cuda or cpu")
    parser.add_argument("--dtype", default="auto", help="auto, float32, float16 or bfloat16")
    parser.add_argument("--quantization", default=None, choices=("none", "int4", "int8", "a8"),
                        help="weight-only kernels (default: the checkpoint's own, a GGUF's Q4/Q8 codes)")
    parser.add_argument("--max-model-len", type=_positive_int, metavar="N",
                        help="longest prompt + output in tokens (default: the model's max_position_embeddings)")
    parser.add_argument("--max-num-seqs", type=_positive_int, default=64, metavar="N",
                        help="requests in the running batch (default 64)")
    parser.add_argument("--max-num-batched-tokens", type=_positive_int, default=1024, metavar="N",
                        help="tokens per engine step, prefill chunks included (default 1024)")
    parser.add_argument("--max-queue", type=_non_negative_int, default=256, metavar="N",
                        help="requests that may wait beyond the running batch; more get 429 (default 256)")
    parser.add_argument("--kv-cache-bytes", type=byte_size, metavar="SIZE",
                        help="KV cache size, e.g. 2GiB (default: from --memory-fraction)")
    parser.add_argument("--block-size", type=_positive_int, default=None, metavar="N",
                        help="KV tokens per page (default: the backend's: 16 on CPU/CUDA, 128 on NPU, where FIA "
                             "takes multiples of 128 for multi-token steps)")
    parser.add_argument("--enable-prefix-caching", action="store_true",
                        help="reuse the KV of earlier prompts' full pages, as vLLM does (off by default here)")
    parser.add_argument("--enforce-eager", action="store_true",
                        help="never replay captured steps (vLLM's flag; only the CUDA backend captures graphs)")
    parser.add_argument("--memory-fraction", type=_fraction, default=0.8, metavar="F",
                        help="share of device memory hyspec may use, applied through the backend (default 0.8)")
    parser.add_argument("--max-tokens", type=_positive_int, default=None, metavar="N",
                        help="most tokens one request may generate: more is a 400 naming this limit, and a request "
                             "that asks for no limit (chat without max_tokens) gets N (default: the context length)")
    parser.add_argument("--max-prompt-chars", type=_positive_int, default=None, metavar="N",
                        help="most characters of prompt text (all prompts, or all chat messages) in one request, "
                             "refused with a 400 before tokenizing (default: 64 per token of --max-model-len)")
    parser.add_argument("--max-n", type=_positive_int, default=None, metavar="N",
                        help="most completions per prompt (n, best_of) one request may ask for; more get 400 "
                             "(default: a quarter of --max-num-seqs, at least 1)")
    parser.add_argument("--split-special-tokens-in-content", action=argparse.BooleanOptionalAction, default=True,
                        help="tokenize control-token text (<|im_start|>) in chat content of other roles than system "
                             "and developer as text, so that a user cannot write a turn of another role (default: on)")
    parser.add_argument("--max-logprobs", type=_non_negative_int, default=20, metavar="K",
                        help="most logprobs / top_logprobs a request may ask for; more get 400 (default 20, as vLLM)")
    parser.add_argument("--logprobs-mode", default="raw_logprobs", choices=("raw_logprobs", "processed_logprobs"),
                        help="logprobs of the model's logits (default) or of the request's processed distribution")
    parser.add_argument("--shutdown-timeout", type=_seconds, default=30.0, metavar="SECONDS",
                        help="how long in-flight requests may run after SIGTERM before they are aborted (default 30)")
    parser.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])


def engine_args(args: argparse.Namespace) -> dict:
    """LLMEngine keyword arguments (with ``model``) from parsed arguments."""
    model = args.model
    if model is None:
        model = str(default_model())
    return {"model": model, "backend": args.backend, "dtype": args.dtype, "max_model_len": args.max_model_len,
            "max_num_seqs": args.max_num_seqs, "max_num_batched_tokens": args.max_num_batched_tokens,
            "kv_cache_bytes": args.kv_cache_bytes, "memory_fraction": args.memory_fraction,
            "block_size": args.block_size, "enable_prefix_caching": args.enable_prefix_caching,
            "enforce_eager": args.enforce_eager,
            "speculative_config": args.speculative_config,
            "max_logprobs": args.max_logprobs, "logprobs_mode": args.logprobs_mode,
            **({"tokenizer": args.tokenizer} if args.tokenizer else {}),
            **({"quantization": args.quantization} if getattr(args, "quantization", None) else {})}


def run(args: argparse.Namespace) -> int:
    try:
        from hyspec.server.app import create_app
        from hyspec.server.launcher import run_server
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.split(".")[0] in _SERVE_MODULES:
            print(f"hyspec serve: error: {exc.name} is not installed; install the server extra with "
                  "`pip install 'hyspec[serve]'`", file=sys.stderr)
            return 2
        raise
    if not _is_loopback(args.host) and not args.api_key:
        log.warning("serving on %s without an API key: anyone who can reach this address can use it", args.host)
    app = create_app(engine_args(args), api_key=args.api_key or None, served_model_name=args.served_model_name,
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
