"""Write core/engine/vllm_schemas.json: vLLM's command-line flags, ``LLM`` keyword arguments and request
fields, and the ``openai`` package's request params, as read from the installed packages.

hyspec's tables of what it implements and refuses (core/engine/vllm_args.py, core/cli/vllm_serve_args.py,
core/server/request_fields.py) are checked against this file by tests, so that CI needs neither vLLM nor
``openai``.  Regenerate it after a vLLM upgrade, with the interpreter that has vLLM::

    .vllm-venv/bin/python scripts/gen_vllm_schemas.py
"""
from __future__ import annotations

import argparse
import dataclasses
import inspect
import json
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "core" / "engine" / "vllm_schemas.json"


def _jsonable(value):
    try:
        json.dumps(value)
        return value
    except TypeError:
        return repr(value)


def serve_flags() -> list[dict]:
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    engine_names = {f.name for f in dataclasses.fields(AsyncEngineArgs)}
    parser = make_arg_parser(FlexibleArgumentParser())
    flags = []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction) or not action.option_strings:
            continue
        # the positive spelling first: --enable-x before --no-enable-x, --max-model-len before -m
        names = sorted(action.option_strings, key=lambda s: (s.startswith("--no-"), not s.startswith("--"), len(s)))
        flags.append({"dest": action.dest, "flags": names, "takes_value": action.nargs != 0,
                      "many_values": action.nargs in ("+", "*"), "default": _jsonable(action.default),
                      "group": "engine" if action.dest in engine_names else "frontend"})
    listed = {f["dest"] for f in flags}
    for name in sorted(engine_names - listed):  # engine fields without a flag (set through the Python API only)
        flags.append({"dest": name, "flags": [], "takes_value": True, "many_values": False, "default": None,
                      "group": "engine"})
    return sorted(flags, key=lambda f: f["dest"])


def llm_kwargs() -> list[str]:
    from vllm import LLM

    return [name for name, p in inspect.signature(LLM.__init__).parameters.items()
            if name != "self" and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)]


def request_fields() -> dict[str, list[str]]:
    from openai.types import completion_create_params
    from openai.types.chat import completion_create_params as chat_create_params
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest
    from vllm.entrypoints.serve.tokenize.protocol import (DetokenizeRequest, TokenizeChatRequest,
                                                          TokenizeCompletionRequest)

    def typed_dict_keys(td) -> list[str]:
        return sorted(td.__required_keys__ | td.__optional_keys__)

    return {
        "vllm.CompletionRequest": sorted(CompletionRequest.model_fields),
        "vllm.ChatCompletionRequest": sorted(ChatCompletionRequest.model_fields),
        "vllm.TokenizeCompletionRequest": sorted(TokenizeCompletionRequest.model_fields),
        "vllm.TokenizeChatRequest": sorted(TokenizeChatRequest.model_fields),
        "vllm.DetokenizeRequest": sorted(DetokenizeRequest.model_fields),
        "openai.CompletionCreateParams": typed_dict_keys(completion_create_params.CompletionCreateParamsBase),
        "openai.ChatCompletionCreateParams": typed_dict_keys(chat_create_params.CompletionCreateParamsBase),
    }


def main() -> int:
    import openai
    import vllm

    data = {"vllm_version": vllm.__version__, "openai_version": openai.__version__,
            "serve_flags": serve_flags(), "llm_kwargs": llm_kwargs(), "request_fields": request_fields()}
    OUT.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    print(f"wrote {OUT}: {len(data['serve_flags'])} flags, {len(data['llm_kwargs'])} LLM kwargs, "
          f"{sum(map(len, data['request_fields'].values()))} request fields", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
