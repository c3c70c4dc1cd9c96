"""`hyspec serve`: arguments, a torch-free import, a clear message without the serve extra, and a real
server process that answers, enforces its API key from the environment and exits 0 on SIGTERM."""
from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys

import httpx
import openai
import pytest
from hyspec.bench.serve_process import free_port, wait_until_healthy
from hyspec.cli import serve


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    serve.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_defaults_bind_loopback_and_map_onto_engine_arguments(monkeypatch):
    monkeypatch.delenv("HYSPEC_API_KEY", raising=False)
    args = parse("--model", "/m", "--kv-cache-bytes", "64MiB", "--speculative-config", '{"method": "ngram"}')
    assert args.host == "127.0.0.1" and args.port == 8000 and args.api_key is None and args.max_tokens is None
    assert parse("--max-tokens", "256").max_tokens == 256
    assert serve.engine_args(parse("--enable-prefix-caching"))["enable_prefix_caching"] is True
    assert serve.engine_args(parse("--enforce-eager"))["enforce_eager"] is True
    assert serve.engine_args(args) == {
        "model": "/m", "backend": "auto", "dtype": "auto", "max_model_len": None, "max_num_seqs": 64,
        "max_num_batched_tokens": 1024, "kv_cache_bytes": 64 << 20, "memory_fraction": 0.8, "block_size": None,
        "enable_prefix_caching": False, "enforce_eager": False, "speculative_config": '{"method": "ngram"}', "max_logprobs": 20, "logprobs_mode": "raw_logprobs",
        "disable_sliding_window": False}
    assert serve.engine_args(parse("--disable-sliding-window"))["disable_sliding_window"] is True


@pytest.mark.parametrize("text, value", [("1048576", 1 << 20), ("8MiB", 8 << 20), ("2G", 2 << 30), ("1.5k", 1536)])
def test_byte_sizes(text, value):
    assert serve.byte_size(text) == value


@pytest.mark.parametrize("argv", [["--port", "70000"], ["--max-queue", "-1"], ["--memory-fraction", "0"],
                                  ["--kv-cache-bytes", "lots"], ["--max-num-seqs", "0"], ["--max-tokens", "0"],
                                  ["--block-size", "0"]])
def test_bad_arguments_are_rejected(argv, capsys):
    with pytest.raises(SystemExit):
        parse(*argv)
    assert "argument --" in capsys.readouterr().err


def run_python(code: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **env})


def test_importing_the_command_imports_neither_torch_nor_the_server_stack():
    r = run_python("import sys, hyspec.cli.serve; "
                   "bad = [m for m in ('torch', 'fastapi', 'uvicorn', 'prometheus_client') if m in sys.modules]; "
                   "print(bad); sys.exit(1 if bad else 0)")
    assert r.returncode == 0, r.stdout + r.stderr


def test_without_the_serve_extra_the_message_says_what_to_install():
    r = run_python("import sys; sys.modules['fastapi'] = None; from hyspec.cli.main import main; "
                   "sys.exit(main(['serve', '--model', '/nonexistent']))")
    assert r.returncode == 2, r.stdout + r.stderr
    assert "fastapi is not installed" in r.stderr and "hyspec[serve]" in r.stderr and "Traceback" not in r.stderr


def test_serve_process_answers_and_exits_cleanly_on_sigterm(tiny_model_dir):
    port = free_port()
    env = {**os.environ, "HYSPEC_API_KEY": "k3y", "OMP_NUM_THREADS": "1", "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "hyspec.cli.main", "serve", "--model", str(tiny_model_dir), "--port", str(port),
         "--backend", "cpu", "--dtype", "float32", "--kv-cache-bytes", "4MiB", "--max-model-len", "64",
         "--served-model-name", "tiny", "--log-level", "warning"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        # the log is read only once the process has ended: reading a live process's pipes would block
        wait_until_healthy(url, proc, 90,
                           log_tail=lambda: ":\n" + proc.communicate()[1][-3000:] if proc.poll() is not None else "")
        assert httpx.post(url + "/v1/completions", json={"prompt": "x"}).status_code == 401
        client = openai.OpenAI(base_url=url + "/v1", api_key="k3y", max_retries=0)
        out = client.completions.create(model="tiny", prompt="def add(a, b):", max_tokens=3, temperature=0,
                                        extra_body={"ignore_eos": True})
        assert out.usage.completion_tokens == 3
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err[-3000:]
        assert f"serving 'tiny' on http://127.0.0.1:{port}/v1" in err and "hyspec serve: stopped" in err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
