"""vLLM's arguments on hyspec's command lines and in LLM(**kwargs): every one implemented or refused by name.

The lists of vLLM's arguments come from core/engine/vllm_schemas.json (written from the installed vLLM by
scripts/gen_vllm_schemas.py), so these tests need no vLLM.
"""
from __future__ import annotations

import argparse
import inspect

import pytest
from hyspec.cli import chat, generate, serve
from hyspec.cli.model_args import ENGINE_OPTIONS
from hyspec.engine.vllm_args import (ENGINE_ARGS, SERVER_ARGS, Implemented, Refused, engine_kwargs, vllm_flag,
                                     vllm_schemas)
from hyspec.errors import ConfigError, HyspecError


def parser_of(module) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=f"hyspec {module.__name__.rsplit('.', 1)[1]}", exit_on_error=True)
    module.add_arguments(parser)
    return parser


def parse(*argv: str, module=serve) -> argparse.Namespace:
    return parser_of(module).parse_args(list(argv))


def refused(capsys, *argv: str, module=serve) -> str:
    with pytest.raises(SystemExit) as exc:
        parse(*argv, module=module)
    assert exc.value.code == 2
    return capsys.readouterr().err


# -- the table covers vLLM ------------------------------------------------------------------------------


def test_every_vllm_argument_is_implemented_or_refused():
    flags = vllm_schemas()["serve_flags"]
    engine = {f["dest"] for f in flags if f["group"] == "engine"}
    frontend = {f["dest"] for f in flags if f["group"] == "frontend"}
    assert set(ENGINE_ARGS) == engine, (sorted(engine ^ set(ENGINE_ARGS)))
    assert set(SERVER_ARGS) == frontend, (sorted(frontend ^ set(SERVER_ARGS)))
    missing_llm = set(vllm_schemas()["llm_kwargs"]) - engine - frontend
    assert not missing_llm
    for name, arg in {**ENGINE_ARGS, **SERVER_ARGS}.items():
        assert isinstance(arg, (Implemented, Refused)), name
        if isinstance(arg, Refused):
            assert len(arg.reason) > 15, name  # a sentence, not a placeholder


def test_implemented_engine_arguments_land_on_real_destinations():
    from hyspec.engine.engine import LLMEngine

    engine_params = set(inspect.signature(LLMEngine.__init__).parameters) | {"model"}
    serve_dests = set(vars(parse()))
    for name, arg in {**ENGINE_ARGS, **SERVER_ARGS}.items():
        if not isinstance(arg, Implemented):
            continue
        if arg.serve_only:
            assert arg.dest.removeprefix("serve.") in serve_dests, name
        else:
            assert arg.dest in engine_params | {"seed"}, name
    assert {o.dest for o in ENGINE_OPTIONS} <= engine_params


# -- hyspec serve -------------------------------------------------------------------------------------


def test_serve_takes_vllms_spelling_of_its_options():
    args = parse("/models/m", "--gpu-memory-utilization", "0.5", "--served-model-name", "a", "b", "--seed", "7",
                 "--max-model-len", "64", "--tensor-parallel-size", "1", "--dtype", "half", "--no-trust-remote-code",
                 "--kv-cache-memory-bytes", "64M", "-q", "int8", "--host", "0.0.0.0", "--port", "8001",
                 "--uvicorn-log-level", "warning", "--enable-chunked-prefill")
    kwargs = serve.engine_args(args)
    assert kwargs["model"] == "/models/m" and kwargs["memory_fraction"] == 0.5 and kwargs["max_model_len"] == 64
    assert kwargs["dtype"] == "float16" and kwargs["kv_cache_bytes"] == 64 << 20 and kwargs["quantization"] == "int8"
    assert args.served_model_name == ["a", "b"] and args.seed == 7 and args.log_level == "warning"
    assert (args.host, args.port) == ("0.0.0.0", 8001)
    assert serve.engine_args(parse("--model", "/m"))["model"] == "/m"
    assert serve.engine_args(parse("/m", "--model", "/m"))["model"] == "/m"
    with pytest.raises(argparse.ArgumentTypeError, match="disagree"):
        serve.engine_args(parse("/a", "--model", "/b"))


@pytest.mark.parametrize("argv, words", [
    (["--tensor-parallel-size", "2"], "one device"),
    (["-tp", "4"], "one device"),
    (["--trust-remote-code"], "never runs a checkpoint's own Python code"),
    (["--enable-lora"], "LoRA"),
    (["--lora-modules", "a=b", "c=d"], "LoRA"),
    (["--kv-cache-dtype", "fp8"], "fp8"),
    (["--ssl-keyfile", "k.pem"], "TLS"),
    (["--tool-call-parser", "hermes"], "tool calling"),
    (["--skip-tokenizer-init"], "needs the tokenizer"),
    (["--no-enable-chunked-prefill"], "always chunks"),
])
def test_serve_refuses_what_hyspec_has_not_got_with_the_reason(capsys, argv, words):
    err = refused(capsys, "/m", *argv)
    assert argv[0] in err and "not supported by hyspec" in err and words in err


def test_every_refused_flag_is_refused_on_the_command_line(capsys):
    parser = parser_of(serve)
    for name, arg in {**ENGINE_ARGS, **SERVER_ARGS}.items():
        entry = vllm_flag(name)
        if not isinstance(arg, Refused) or not entry or not entry["flags"]:
            continue
        flag = next(f for f in entry["flags"] if not f.startswith("--no-"))
        argv = [flag, "zz-unsupported"] if entry["takes_value"] else [flag]
        if not entry["takes_value"] and True in arg.accepts:
            continue  # its positive spelling asks for what hyspec does; --no- is refused (parametrized above)
        with pytest.raises(SystemExit):
            parser.parse_args(argv)
        assert arg.reason in capsys.readouterr().err, name


def test_generate_and_chat_share_the_engine_options(capsys):
    for module in (generate, chat):
        args = parse("--gpu-memory-utilization", "0.25", "--max-model-len", "32", "--kv-cache-bytes", "1MiB",
                     module=module)
        assert (args.memory_fraction, args.max_model_len, args.kv_cache_bytes) == (0.25, 32, 1 << 20)
        assert "not supported by hyspec" in refused(capsys, "-tp", "2", module=module)
        assert "hyspec serve" in refused(capsys, "--served-model-name", "x", module=module)
    assert parse("--seed", "3", module=generate).seed == 3  # generate's own --seed (the requests') stays


@pytest.mark.parametrize("flag, text, value", [
    ("--kv-cache-memory-bytes", "8g", 8 * 10**9), ("--kv-cache-memory-bytes", "8G", 8 << 30),  # vLLM's reading
    ("--kv-cache-bytes", "8G", 8 << 30), ("--kv-cache-bytes", "8g", 8 << 30),  # hyspec's: powers of 1024
    ("--max-model-len", "4k", 4000), ("--max-model-len", "4K", 4096), ("--max-model-len", "auto", None),
    ("--max-model-len", "-1", None), ("--max-num-batched-tokens", "25.6k", 25600),
])
def test_sizes_read_as_each_spelling_reads_them(flag, text, value):
    dest = {"--kv-cache-memory-bytes": "kv_cache_bytes"}.get(flag, flag[2:].replace("-", "_"))
    assert getattr(parse(flag, text), dest) == value


def test_api_key_from_vllms_variable(monkeypatch):
    monkeypatch.delenv("HYSPEC_API_KEY", raising=False)
    monkeypatch.setenv("VLLM_API_KEY", "v-key")
    assert serve.api_key(parse()) == "v-key"
    assert serve.api_key(parse("--api-key", "cli")) == "cli"
    monkeypatch.setenv("HYSPEC_API_KEY", "v-key")
    assert serve.api_key(parse()) == "v-key"
    monkeypatch.setenv("HYSPEC_API_KEY", "other")
    with pytest.raises(HyspecError, match="both set"):
        serve.api_key(parse())
    with pytest.raises(HyspecError, match="one key"):
        serve.api_key(parse("--api-key", "a", "b"))


def test_chat_template_is_a_file_or_the_template(tmp_path):
    path = tmp_path / "t.jinja"
    path.write_text("{{ messages[0]['content'] }}")
    assert serve.chat_template(str(path)) == "{{ messages[0]['content'] }}"
    assert serve.chat_template("{% for m in messages %}{{ m.content }}{% endfor %}").startswith("{%")
    with pytest.raises(HyspecError, match="neither a file nor a Jinja template"):
        serve.chat_template(str(tmp_path / "missing.jinja"))


# -- LLM(**kwargs) ------------------------------------------------------------------------------------

HYSPEC = frozenset({"memory_fraction", "kv_cache_bytes", "backend", "dtype", "max_num_seqs", "tokenizer"})


def test_llm_keywords_translate_vllms_names():
    kwargs, seed = engine_kwargs({"gpu_memory_utilization": 0.5, "kv_cache_memory_bytes": 1 << 20, "seed": 3,
                                  "tensor_parallel_size": 1, "trust_remote_code": False, "enforce_eager": True,
                                  "max_num_seqs": 4, "dtype": "half"}, HYSPEC)
    assert kwargs == {"memory_fraction": 0.5, "kv_cache_bytes": 1 << 20, "enforce_eager": True, "max_num_seqs": 4,
                      "dtype": "float16"}
    assert seed == 3


@pytest.mark.parametrize("kwargs, words", [
    ({"tensor_parallel_size": 2}, "one device"), ({"trust_remote_code": True}, "Python code"),
    ({"enable_lora": True}, "LoRA"), ({"revision": "main"}, "downloads"),
    ({"served_model_name": "x"}, "server option"), ({"bogus_option": 1}, "unknown argument"),
    ({"gpu_memory_utilization": 0.5, "memory_fraction": 0.4}, "same setting"),
])
def test_llm_keywords_hyspec_has_not_got_are_refused_by_name(kwargs, words):
    with pytest.raises(ConfigError, match=words) as exc:
        engine_kwargs(kwargs, HYSPEC)
    assert exc.value.key == next(iter(kwargs))


def test_llm_takes_vllms_keywords(tiny_ckpt):
    from hyspec import LLM, SamplingParams

    path = str(tiny_ckpt[0])
    with LLM(path, dtype="float32", backend="cpu", kv_cache_bytes=1 << 20, gpu_memory_utilization=0.5,
             tensor_parallel_size=1, seed=11, chat_template="{{ messages[0]['content'] }}!") as llm:
        first = llm.generate("a b", SamplingParams(temperature=1.0, max_tokens=4))[0].outputs[0].token_ids
        assert llm.tokenizer.apply_chat_template([{"role": "user", "content": "hi"}]) == "hi!"
    with LLM(path, dtype="float32", backend="cpu", kv_cache_bytes=1 << 20, seed=11) as llm:
        again = llm.generate("a b", SamplingParams(temperature=1.0, max_tokens=4))[0].outputs[0].token_ids
    assert first == again  # the engine seed makes unseeded sampling repeatable, as vLLM's seed does
    with pytest.raises(ConfigError, match="tensor_parallel_size"):
        LLM(path, dtype="float32", backend="cpu", kv_cache_bytes=1 << 20, tensor_parallel_size=2)
