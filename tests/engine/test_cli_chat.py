"""``hyspec chat``: turns from --message or standard input, streamed text equal to LLM.chat's, bad input."""
from __future__ import annotations

import io

import pytest

from hyspec import LLM, SamplingParams
from hyspec.cli.main import main
from tests.model.tiny_checkpoint import make_checkpoint

KV = str(4 << 20)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("chat") / "model"
    make_checkpoint(path)
    return path


def _expected(model_dir, conversation: list[dict[str, str]], max_tokens: int) -> str:
    llm = LLM(str(model_dir), kv_cache_bytes=int(KV))
    return llm.chat(conversation, SamplingParams(temperature=0, max_tokens=max_tokens))[0].outputs[0].text


def test_message_turns_stream_what_llm_chat_returns(model_dir, capsys):
    assert main(["chat", "--model", str(model_dir), "--message", "hello", "--message", "again",
                 "--max-tokens", "6", "--kv-cache-bytes", KV]) == 0
    out, err = capsys.readouterr()
    first = _expected(model_dir, [{"role": "user", "content": "hello"}], 6)
    second = _expected(model_dir, [{"role": "user", "content": "hello"}, {"role": "assistant", "content": first},
                                   {"role": "user", "content": "again"}], 6)
    assert out == first + "\n" + second + "\n"  # the second turn sees the first answer (history kept)
    assert err.count("tokens in") == 2 and "finish_reason=" in err


def test_piped_stdin_turns_and_reset(model_dir, capsys, monkeypatch):
    monkeypatch.setattr("sys.stdin", io.StringIO("hello\n\n/reset\nhello\n/exit\nnever read\n"))
    assert main(["chat", "--model", str(model_dir), "--max-tokens", "5", "--kv-cache-bytes", KV,
                 "--no-stats", "--speculative-config", '{"method": "ngram", "num_speculative_tokens": 3}']) == 0
    out, err = capsys.readouterr()
    answer = _expected(model_dir, [{"role": "user", "content": "hello"}], 5)
    assert out == answer + "\n" + answer + "\n"  # after /reset the same first turn gives the same answer
    assert "(conversation reset)" in err and "tokens in" not in err


def test_a_conversation_longer_than_the_context_is_reported_and_the_session_goes_on(model_dir, capsys, monkeypatch):
    monkeypatch.setattr("sys.stdin", io.StringIO("word " * 300 + "\nhi\n"))
    assert main(["chat", "--model", str(model_dir), "--max-tokens", "3", "--kv-cache-bytes", KV,
                 "--max-model-len", "64"]) == 0
    out, err = capsys.readouterr()
    assert "max_model_len is 64" in err and "/reset starts a new conversation" in err
    assert out.strip()  # the next, short turn was answered


def test_bad_input(model_dir, tmp_path, capsys):
    assert main(["chat", "--model", str(model_dir), "--message", "x", "--max-tokens", "0"]) == 2
    assert "--max-tokens must be positive" in capsys.readouterr().err
    no_template = tmp_path / "plain"
    make_checkpoint(no_template)
    cfg = no_template / "tokenizer_config.json"
    cfg.write_text(cfg.read_text().replace('"chat_template"', '"unused"'))
    assert main(["chat", "--model", str(no_template), "--message", "x", "--kv-cache-bytes", KV]) == 2
    assert "no chat template" in capsys.readouterr().err
