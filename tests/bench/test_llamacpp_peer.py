"""The llama.cpp peer's plumbing: the child-process protocol, its reasons for not running, its goals.

llama-cpp-python takes ~15 minutes to compile, so it is never installed for the tests: a stand-in
``llama_cpp`` package (deterministic tokens, the same API surface the worker uses) runs the real
worker script in a real child process.  The measured comparison is in docs/results/.
"""
from __future__ import annotations

import stat
import sys
from pathlib import Path

import pytest

from hyspec.bench.llamacpp_peer import LlamaCppPeer, llamacpp_missing, resolve_python
from hyspec.bench.measure import Workload
from hyspec.bench.peers import PeerUnavailable

FAKE_LLAMA_CPP = '''
__version__ = "0.0-standin"
CALLS = []

def llama_print_system_info():
    return b"AVX2 = 1 | standin"

class Llama:
    def __init__(self, model_path, n_ctx, n_batch, n_threads, n_threads_batch, draft_model, verbose, seed):
        import os
        if os.environ.get("STANDIN_FAIL"):
            raise ValueError("Failed to load model from file: " + model_path)
        self.draft = draft_model
        self.resets = 0

    def reset(self):
        self.resets += 1

    def generate(self, tokens, top_k, top_p, min_p, temp, repeat_penalty, reset):
        assert top_k == 1 and temp == 0.0 and reset
        # the next token depends on the prompt only (greedy); prompt lookup must not change it
        i = 0
        while True:
            yield (sum(tokens) + i) % 50
            i += 1
'''
FAKE_SPECULATIVE = '''
class LlamaPromptLookupDecoding:
    def __init__(self, num_pred_tokens, max_ngram_size):
        self.num_pred_tokens, self.max_ngram_size = num_pred_tokens, max_ngram_size
'''


@pytest.fixture
def standin_python(tmp_path) -> str:
    """An executable that runs this Python with the stand-in llama_cpp importable."""
    pkg = tmp_path / "site" / "llama_cpp"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(FAKE_LLAMA_CPP)
    (pkg / "llama_speculative.py").write_text(FAKE_SPECULATIVE)
    exe = tmp_path / "python-with-llama-cpp"
    exe.write_text(f'#!/bin/sh\nPYTHONPATH="{tmp_path / "site"}" exec "{sys.executable}" "$@"\n')
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    return str(exe)


def _gguf(tmp_path: Path) -> Path:
    path = tmp_path / "model.gguf"
    path.write_bytes(b"GGUF")  # the stand-in never reads it
    return path


def _workload(batch_size=1, temperature=0.0, max_tokens=6):
    return Workload.build([(5, 6, 7), (1, 2), (9,)], batch_size, temperature, max_tokens, seed=0)


def test_runs_the_worker_and_reads_back_tokens_times_and_memory(standin_python, tmp_path):
    peer = LlamaCppPeer(standin_python, _gguf(tmp_path), threads=2, num_speculative_tokens=4, n_ctx=64)
    for name in ("llamacpp", "llamacpp_prompt_lookup"):
        m = peer.run(name, _workload(), repeats=2)
        expected = [[(sum(p) + i) % 50 for i in range(6)] for p in ((5, 6, 7), (1, 2), (9,))]
        assert m.outputs == [expected, expected]  # per repeat, per prompt, exactly max_tokens tokens
        assert m.generated_tokens == 18 and len(m.tokens_per_s.runs) == 2 and m.tokens_per_s.median > 0
        assert len(m.ttft_s.runs) == 6 and m.peak.rss_bytes > 1 << 20
        assert m.notes == ["llama-cpp-python 0.0-standin, 2 threads"]
    assert peer.info["system_info"].startswith("AVX2 = 1")


def test_reasons_it_does_not_run(standin_python, tmp_path):
    reason, _ = llamacpp_missing(str(tmp_path / "no-such-python"))
    assert reason.startswith(f"no Python at {tmp_path / 'no-such-python'}") and "pip install llama-cpp-python" in reason
    assert llamacpp_missing(standin_python) == (None, "0.0-standin")
    if llamacpp_missing(sys.executable)[0] is not None:  # the test environment never has it
        assert "llama-cpp-python is not installed for" in llamacpp_missing(sys.executable)[0]
    with pytest.raises(PeerUnavailable, match="llama.cpp reads GGUF files; model is not one"):
        LlamaCppPeer(standin_python, tmp_path / "model", 2, 4, 64)
    peer = LlamaCppPeer(standin_python, _gguf(tmp_path), 2, 4, 64)
    with pytest.raises(PeerUnavailable, match="batch size 1 only"):
        peer.run("llamacpp", _workload(batch_size=2), 1)
    with pytest.raises(PeerUnavailable, match="greedy decoding only"):
        peer.run("llamacpp", _workload(temperature=0.7), 1)


def test_a_failing_worker_is_an_error_naming_its_last_line(standin_python, tmp_path, monkeypatch):
    monkeypatch.setenv("STANDIN_FAIL", "1")
    peer = LlamaCppPeer(standin_python, _gguf(tmp_path), 2, 4, 64)
    with pytest.raises(RuntimeError, match="worker exited with status 1: ValueError: Failed to load model"):
        peer.run("llamacpp", _workload(), 1)


def test_python_resolution_order(monkeypatch):
    monkeypatch.delenv("HYSPEC_LLAMACPP_PYTHON", raising=False)
    assert resolve_python(None) == sys.executable
    monkeypatch.setenv("HYSPEC_LLAMACPP_PYTHON", "/opt/lc/bin/python")
    assert resolve_python(None) == "/opt/lc/bin/python" and resolve_python("/x/python") == "/x/python"


def test_goals_against_llama_cpp():
    from hyspec.bench.result import goals

    def row(engine, method, rate):
        return {"engine": engine, "method": method, "batch_size": 1, "temperature": 0.0, "status": "ok",
                "label": method, "tokens_per_s": {"median": rate}}

    rows = [row("hyspec", "none", 50.0), row("hyspec", "ngram", 150.0), row("llama.cpp", "llamacpp", 60.0),
            row("llama.cpp", "llamacpp_prompt_lookup", 40.0)]
    by_goal = {g["goal"]: g for g in goals(rows)}
    plain = by_goal["hyspec plain decoding >= 1.0x llama.cpp plain (batch 1)"]
    assert plain["measured"] == pytest.approx(50 / 60) and plain["met"] is False
    assert by_goal["best method >= 2x llama.cpp plain (batch 1)"]["measured"] == pytest.approx(2.5)
    assert by_goal["best method >= 2x llama.cpp prompt lookup (batch 1)"]["met"] is True
    # without llama.cpp rows there are no llama.cpp goals
    assert not any("llama.cpp" in g["goal"] for g in goals(rows[:2]))


def test_worker_is_standalone():
    """The worker runs under another venv's Python: only the standard library and llama_cpp."""
    import ast

    source = (Path(__file__).resolve().parents[2] / "core" / "bench" / "llamacpp_worker.py").read_text()
    modules = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            modules |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            modules.add((node.module or "").split(".")[0])
    assert modules <= {"__future__", "json", "resource", "sys", "time", "llama_cpp"} | set(sys.stdlib_module_names)
    assert "hyspec" not in modules and "torch" not in modules


def test_prefill_is_the_prompt_over_the_time_to_its_first_token(standin_python, tmp_path):
    from hyspec.bench.prefill import llamacpp_prefill

    peer = LlamaCppPeer(standin_python, _gguf(tmp_path), threads=2, num_speculative_tokens=4, n_ctx=64)
    doc = llamacpp_prefill(peer, list(range(40)), repeats=2)
    assert doc["engine"] == "llamacpp" and doc["label"] == "llama.cpp plain"
    rates = doc["tokens_per_s"]
    assert len(rates["runs"]) == 2 and all(r > 0 for r in rates["runs"])  # one figure per repeat, none dropped
    assert rates["min"] <= rates["median"] <= rates["max"]
