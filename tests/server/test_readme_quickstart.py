"""The README's copy of vLLM's quickstart (``vllm serve MODEL`` + two curls, with ``vllm`` replaced by
``hyspec``): its commands parse as written, and the server they start answers its requests, here around the
tiny checkpoint standing in for the exported default model (same directory name)."""
from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import httpx
from hyspec.cli import serve
from hyspec.cli.main import build_parser

from tests.model.tiny_checkpoint import make_checkpoint
from tests.server.conftest import ENGINE_ARGS

README = Path(__file__).resolve().parents[2] / "README.md"


def quickstart_commands() -> list[list[str]]:
    text = README.read_text()
    block = re.search(r"<!-- vllm-quickstart[^>]*-->\s*```bash\n(.*?)```", text, re.DOTALL)
    assert block, "README.md lost its vllm-quickstart block"
    commands, pending = [], ""
    for line in block.group(1).replace("\\\n", " ").splitlines():
        pending += line + "\n"
        try:  # a quoted argument (curl's -d JSON) may span lines
            words = shlex.split(pending.strip().rstrip("&"))
        except ValueError:
            continue
        if words:
            commands.append(words)
        pending = ""
    assert not pending.strip(), f"unterminated command in the README block: {pending!r}"
    return commands


def test_the_readme_quickstart_parses_and_serves(tmp_path):
    commands = quickstart_commands()
    hyspec = [c[1:] for c in commands if c[0] == "hyspec"]
    curls = [c for c in commands if c[0] == "curl"]
    assert [c[0] for c in hyspec] == ["export-hf", "serve"] and len(curls) == 2
    parser = build_parser()
    exported = parser.parse_args(hyspec[0]).out
    args = parser.parse_args(hyspec[1])
    assert serve.engine_args(args)["model"] == exported  # serve takes the model positionally, as vllm serve

    from hyspec.server.app import create_app
    from hyspec.server.launcher import BackgroundServer

    model_dir = tmp_path / exported  # the tiny checkpoint under the exported model's name
    make_checkpoint(model_dir)
    engine = {**serve.engine_args(args), **ENGINE_ARGS, "model": str(model_dir)}
    server = BackgroundServer(create_app(engine, served_model_name=args.served_model_name,
                                         allowed_hosts=serve.allowed_hosts(args))).start()
    try:
        for curl in curls:
            url = next(a for a in curl if a.startswith("http://"))
            path = url.split("localhost:8000", 1)[1]
            assert url.startswith(f"http://localhost:{args.port}")
            if "-d" in curl:
                body = json.loads(curl[curl.index("-d") + 1])
                r = httpx.post(server.url + path, json=body, headers={"Host": "localhost"}, timeout=60)
                assert r.status_code == 200, r.text
                out = r.json()
                assert out["model"] == exported and 1 <= out["usage"]["completion_tokens"] <= body["max_tokens"]
            else:
                r = httpx.get(server.url + path, headers={"Host": "localhost"}, timeout=30)
                assert r.status_code == 200 and [m["id"] for m in r.json()["data"]] == [exported]
    finally:
        server.stop()
