"""The vLLM peer's plumbing: the worker protocol, the rows' JSON, their skip reasons, the settings.

vLLM's CPU build lives in a venv of its own and takes minutes to start, so these tests run the real worker
(``python -m hyspec.bench.vllm_worker``) in a real child process against a stand-in ``vllm`` package with
the API surface the worker uses (deterministic tokens, spec counters).  The real vLLM runs in the slow tier
(test_vllm_peer_real.py); measured rows are in docs/results/.
"""
from __future__ import annotations

import io
import json
import stat
import sys
from pathlib import Path

import pytest

from hyspec.bench import vllm_peer, vllm_worker
from hyspec.bench.identity import IDENTICAL, MISMATCH, IdentityVerdict
from hyspec.bench.measure import Workload
from hyspec.bench.readme import render_readme_section
from hyspec.bench.report import format_table
from hyspec.bench.result import OK, SKIPPED, VLLM, Document, Row, peer_engine
from hyspec.bench.settings import DEFAULT_PEERS, VLLM_PEERS, BenchSettings
from hyspec.bench.vllm_rows import RUN_ORDER, VllmRows
from hyspec.errors import ConfigError

STANDIN_VLLM = '''
import json, os
__version__ = "0.0-standin"

class SamplingParams:
    def __init__(self, temperature, max_tokens, ignore_eos, seed=None):
        assert ignore_eos
        self.temperature, self.max_tokens, self.seed = temperature, max_tokens, seed

class _Completion:
    def __init__(self, token_ids):
        self.token_ids = token_ids

class _Stats:
    first_token_latency = 0.01

class _Output:
    def __init__(self, token_ids):
        self.outputs, self.metrics = [_Completion(token_ids)], _Stats()

class _Metric:
    def __init__(self, name, value=None, values=None):
        self.name, self.value, self.values = name, value, values

class _Drafter:
    def __init__(self):
        self.cache = _Store()

class _Store:  # hyspec's TokenStore of finished responses, as forget_between_passes sees it
    def __init__(self):
        self.items = []
    def __len__(self):
        return len(self.items)
    def evict_oldest(self):
        self.items.pop(0)

class _ModelRunner:
    def __init__(self):
        self.drafter = _Drafter()

class _Worker:
    def __init__(self):
        self.model_runner = _ModelRunner()

class LLM:
    def __init__(self, model, dtype, max_model_len, gpu_memory_utilization, seed, speculative_config,
                 enable_prefix_caching, disable_log_stats):
        assert not disable_log_stats  # the counters and TTFTs come from the stats
        if os.environ.get("STANDIN_FAIL"):
            raise RuntimeError("Engine core initialization failed. See root cause above.")
        self.spec = speculative_config
        if self.spec and self.spec["method"] == "custom_class":
            self.options = json.load(open(os.environ["HYSPEC_VLLM_CONFIG"]))
        self.counters = {"drafts": 0, "draft_tokens": 0, "accepted": 0, "per_pos": [0, 0, 0, 0]}
        self.worker = _Worker()

    def generate(self, prompts, params, use_tqdm):
        outs = []
        for prompt, p in zip(prompts, params):
            ids = prompt["prompt_token_ids"]
            tokens = [(sum(ids) + i) % 50 for i in range(p.max_tokens)]
            if self.spec and getattr(self, "options", {}).get("standin_differ"):
                tokens[-1] = 49 - tokens[-1]
            outs.append(_Output(tokens))
            self.worker.model_runner.drafter.cache.items.append(tokens)
            if self.spec:
                self.counters["drafts"] += 2
                self.counters["draft_tokens"] += 8
                self.counters["accepted"] += 3
                self.counters["per_pos"] = [a + b for a, b in zip(self.counters["per_pos"], [2, 1, 0, 0])]
        return outs

    def get_metrics(self):
        c = self.counters
        return [_Metric("vllm:spec_decode_num_drafts", c["drafts"]),
                _Metric("vllm:spec_decode_num_draft_tokens", c["draft_tokens"]),
                _Metric("vllm:spec_decode_num_accepted_tokens", c["accepted"]),
                _Metric("vllm:spec_decode_num_accepted_tokens_per_pos", values=list(c["per_pos"])),
                _Metric("vllm:num_requests_running", 0)]

    def reset_prefix_cache(self):
        return True

    def collective_rpc(self, method):
        return [method(self.worker)]
'''


@pytest.fixture
def standin_python(tmp_path) -> str:
    """An executable running this Python with the stand-in vllm importable (hyspec is already)."""
    site = tmp_path / "site"
    for package in ("vllm", "vllm/v1", "vllm/v1/spec_decode"):
        (site / package).mkdir(parents=True)
        (site / package / "__init__.py").write_text("")
    (site / "vllm" / "__init__.py").write_text(STANDIN_VLLM)
    (site / "vllm" / "inputs.py").write_text("TokensPrompt = dict\n")
    (site / "vllm" / "v1" / "spec_decode" / "custom_class_proposer.py").write_text("")
    exe = tmp_path / "python-with-vllm"
    exe.write_text(f'#!/bin/sh\nPYTHONPATH="{site}" exec "{sys.executable}" "$@"\n')
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    return str(exe)


@pytest.fixture
def hf_dir(tmp_path) -> Path:
    model = tmp_path / "hf"
    model.mkdir()
    (model / "config.json").write_text("{}")  # the stand-in never reads it
    return model


def _workloads(batch_sizes=(1, 2), temperature=0.0, max_tokens=5):
    return [Workload.build([(5, 6, 7), (1, 2)], bs, temperature, max_tokens, seed=0) for bs in batch_sizes]


def _expected(workload: Workload) -> list[list[int]]:
    return [[(sum(p) + i) % 50 for i in range(workload.max_tokens)] for p in workload.prompts]


def _rows(settings: BenchSettings, model: Path, workloads, prefill=None, peers=VLLM_PEERS, log_dir=None):
    seen = []

    def agreement(w, outputs):
        seen.append(w.key())
        return IdentityVerdict(IDENTICAL, sequences=len(outputs))

    runner = VllmRows(settings, model, workloads, agreement, prefill_prompt=prefill,
                      log_dir=log_dir or model.parent / "vllm-logs")
    return runner, runner.run(peers), seen


def test_rows_run_the_worker_and_read_back_tokens_acceptance_identity_and_prefill(standin_python, hf_dir, tmp_path):
    settings = BenchSettings(vllm_python=standin_python, repeats=2, max_tokens=5, peers=VLLM_PEERS)
    workloads = _workloads()
    runner, rows, seen = _rows(settings, hf_dir, workloads, prefill=list(range(1, 40)))
    by = {(r.method, r.batch_size): r for r in rows}
    assert [r.method for r in rows] == [p for p in RUN_ORDER for _ in workloads]  # vLLM plain, vLLM + hyspec first
    assert RUN_ORDER[:2] == ("vllm", "vllm_hyspec") and sorted(RUN_ORDER) == sorted(VLLM_PEERS)
    for w in workloads:
        plain = by["vllm", w.batch_size]
        assert plain.status == OK and plain.engine == VLLM and plain.identity is None
        assert plain.measurement.outputs == [_expected(w), _expected(w)]  # per repeat, per request
        assert plain.measurement.acceptance is None  # no speculation, no counters
        assert plain.agreement.status == IDENTICAL  # vs hyspec plain, through the runner's callback
        hyspec_row = by["vllm_hyspec", w.batch_size]
        assert hyspec_row.status == OK and hyspec_row.identity.status == IDENTICAL  # vs vLLM plain's tokens
        acc = hyspec_row.measurement.acceptance  # the counters' change over the timed passes, not the warm-up
        passes = 2 * len(w.prompts)
        assert acc["drafts"] == 2 * passes and acc["accepted_tokens"] == 3 * passes
        assert acc["mean_acceptance_length"] == pytest.approx(1 + 3 / 2)
        assert acc["per_position"] == [pytest.approx(1.0), pytest.approx(0.5), 0.0, 0.0]
    assert seen.count((1, 0.0)) == 3  # every row that ran was compared with hyspec plain
    reasons = {r.method: r.reason for r in rows if r.status == SKIPPED}
    assert set(reasons) == {"vllm_suffix", "vllm_eagle3"}
    assert "pip install arctic-inference" in reasons["vllm_suffix"]
    assert "--vllm-eagle3" in reasons["vllm_eagle3"] and "export-drafter" in reasons["vllm_eagle3"]
    assert runner.prefill["label"] == "vLLM" and runner.prefill["tokens_per_s"]["median"] > 0
    assert runner.info["version"] == "0.0-standin" and runner.info["arctic_inference"] is False
    # the rows go into the document with the vLLM speed-ups
    doc = Document(command=["hyspec", "bench"], machine={"cpu": "test"},
                   model={"name": "m", "parameters": 1e6, "dtype": "float32", "vllm": runner.info},
                   dataset={"name": "t", "num_prompts": 2}, settings=settings.to_dict(),
                   bandwidth={"copy": {"bytes_per_s": 1e9}, "decode_weight_bytes": 1 << 20,
                              "plain_limit_tokens_per_s_bs1": 1e3},
                   drafters={}, memory_method="test", rows=rows,
                   prefill={"prompt_tokens": 39, "repeats": 2, "engines": [runner.prefill]}).to_dict()
    row = next(r for r in doc["results"] if r["method"] == "vllm_ngram" and r["batch_size"] == 1)
    assert row["label"] == "vLLM ngram" and row["speedup_vs_peers"]["vllm"] is not None
    assert row["identity"]["token_identical"] is True and row["acceptance"]["source"].startswith("vLLM")
    assert doc["passed"] and doc["prefill"]["engines"][0]["engine"] == VLLM
    goals = {g["goal"]: g for g in doc["goals"]}
    ours = goals["vLLM + hyspec >= 1.5x vLLM plain (batch 1; issue 46: agentic)"]
    assert ours["measured"] is not None and "vLLM plain" in ours["detail"]
    assert goals["hyspec plain >= 1.5x vLLM plain at every batch size (issue 51)"]["measured"] is None  # no hyspec
    table = format_table({**doc, "dataset": {"name": "t", "num_prompts": 2, "prompt_tokens": {"mean": 3},
                                             "truncated": 0}, "model": {**doc["model"], "decode_weight_bytes": 1}})
    assert "×vLLM" in table and "= vLLM plain" in table and "prefill of one 39-token prompt" in table
    text = render_readme_section(json.loads(json.dumps(doc)))
    assert "| × vLLM |" in text and "vLLM 0.0-standin (CPU build)" in text
    assert "| vLLM + hyspec | 1 | 0 |" in text and "yes (vs vLLM plain)" in text
    assert "Prefill of one 39-token prompt" in text and "vLLM " in text.split("Prefill")[1]


def test_a_speculative_row_that_differs_from_vllm_plain_says_where(standin_python, hf_dir):
    settings = BenchSettings(vllm_python=standin_python, repeats=1, peers=("vllm", "vllm_hyspec"),
                             vllm_hyspec_options={"method": "suffix", "standin_differ": True})
    _, rows, _ = _rows(settings, hf_dir, _workloads((1,)), peers=settings.peers)
    verdict = rows[1].identity
    assert verdict.status == MISMATCH and verdict.mismatches == 2
    assert "differs from vLLM plain at output token 4" in verdict.details[0]


def test_engine_that_fails_to_start_is_a_failed_row_naming_its_log(standin_python, hf_dir, monkeypatch, tmp_path):
    monkeypatch.setenv("STANDIN_FAIL", "1")
    settings = BenchSettings(vllm_python=standin_python, repeats=1, peers=("vllm",))
    runner = VllmRows(settings, hf_dir, _workloads(), lambda w, o: None, log_dir=tmp_path / "logs")
    rows = runner.run(settings.peers)
    assert [r.status for r in rows] == ["failed", "failed"]
    assert "Engine core initialization failed" in rows[0].reason and "vllm.log" in rows[0].reason


@pytest.mark.parametrize("python, model, expected", [
    (None, "hf", "no vLLM Python given"),
    ("/nonexistent/python", "hf", "no Python at /nonexistent/python"),
    (sys.executable, "hf", "vLLM is not installed for"),  # hyspec's own venv never has vLLM
    ("standin", "model.gguf", "hyspec export-hf DIR --model"),
])
def test_every_row_is_skipped_with_the_reason_when_vllm_cannot_run(python, model, expected, standin_python,
                                                                    hf_dir, tmp_path, monkeypatch):
    monkeypatch.delenv("HYSPEC_VLLM_PYTHON", raising=False)
    python = standin_python if python == "standin" else python
    bench_model = hf_dir if model == "hf" else tmp_path / model
    settings = BenchSettings(vllm_python=python, peers=VLLM_PEERS)
    _, rows, _ = _rows(settings, bench_model, _workloads())
    assert len(rows) == len(VLLM_PEERS) * 2 and {r.status for r in rows} == {SKIPPED}
    assert expected in rows[0].reason


def test_worker_protocol_answers_errors_without_dying():
    """The real worker's loop, in this process: no vLLM here, so 'load' is unavailable; bad ops are errors."""
    requests = io.StringIO("\n".join(json.dumps(r) for r in (
        {"op": "pass", "waves": []}, {"op": "dance"}, {"op": "load", "model": "x", "max_model_len": 8,
                                                       "memory_fraction": 0.1}, {"op": "quit"})) + "\n")
    answers = io.StringIO()
    assert vllm_worker.serve(requests, answers) == 0
    got = [json.loads(line) for line in answers.getvalue().splitlines()]
    assert got[0] == {"ok": False, "kind": "failed", "error": "ValueError: 'pass' before 'load'"}
    assert got[1]["error"] == "ValueError: unknown op 'dance'"
    assert got[2]["ok"] is False and got[2]["kind"] == "unavailable" and "vllm" in got[2]["error"]
    assert got[3] == {"ok": True}


def test_worker_that_dies_is_an_error_not_a_hang(tmp_path):
    worker = vllm_peer.VllmWorker([sys.executable, "-c", "import sys; sys.stdin.readline(); sys.exit(3)"])
    with pytest.raises(vllm_peer.WorkerError, match="exited without answering 'load'.*exit status 3"):
        worker.ask({"op": "load"})
    worker.close()
    slow = vllm_peer.VllmWorker([sys.executable, "-c", "import time; time.sleep(60)"], timeout_s=0.5)
    with pytest.raises(vllm_peer.WorkerError, match="did not answer 'pass' within 0.5 s"):
        slow.ask({"op": "pass"})
    assert slow.process.poll() is not None  # killed, not left behind


def test_counters_and_their_change_over_a_pass():
    before = {"drafts": 1, "draft_tokens": 4, "accepted_tokens": 2, "accepted_per_position": [1, 1]}
    after = {"drafts": 3, "draft_tokens": 12, "accepted_tokens": 5, "accepted_per_position": [3, 1, 1]}
    delta = vllm_worker.counters_delta(before, after)
    assert delta == {"drafts": 2, "draft_tokens": 8, "accepted_tokens": 3, "accepted_per_position": [2, 0, 1]}
    acc = vllm_peer.acceptance([delta, delta])
    assert acc["mean_acceptance_length"] == 2.5 and acc["acceptance_rate"] == 6 / 16
    assert vllm_peer.acceptance([]) is None


def test_settings_and_cli_options(monkeypatch):
    from hyspec.cli.bench import _settings, add_arguments
    import argparse

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    plain = _settings(parser.parse_args(["--quick"]))
    assert plain.peers == DEFAULT_PEERS  # no vLLM Python named: no vLLM rows
    with_vllm = _settings(parser.parse_args(["--quick", "--vllm-python", "/x/python", "--prefill-tokens", "1024",
                                             "--vllm-hyspec-options", '{"method": "suffix"}']))
    assert with_vllm.peers == DEFAULT_PEERS + VLLM_PEERS and with_vllm.prefill_tokens == 1024
    assert with_vllm.vllm_hyspec_options == {"method": "suffix"}
    assert with_vllm.to_dict()["vllm_python"] == "/x/python"
    assert peer_engine("vllm_hyspec") == VLLM and peer_engine("llamacpp") != VLLM
    with pytest.raises(ConfigError, match="--vllm-memory-fraction"):
        BenchSettings(vllm_memory_fraction=1.5)
    with pytest.raises(ConfigError, match="--prefill-tokens"):
        BenchSettings(prefill_tokens=1)
    with pytest.raises(ConfigError, match="--vllm-hyspec-options.*'bogus' is not one of"):
        vllm_peer.check_hyspec_options({"method": "bogus"})
    vllm_peer.check_hyspec_options({"method": "hybrid"})


def test_row_json_of_a_skipped_vllm_peer():
    row = Row(VLLM, "vllm_eagle3", 8, 0.0, SKIPPED, "no EAGLE-3 head").to_dict()
    assert row["engine"] == "vllm" and row["label"] == "vLLM eagle3 (hyspec's head)" and row["tokens_per_s"] is None


def test_forget_between_passes_drops_finished_and_still_live_requests_of_both_drafters():
    from types import SimpleNamespace

    from hyspec.drafters.suffix.store import TokenStore
    from hyspec.vllm.requests import RequestTable

    class SuffixCache:  # arctic_inference's SuffixDecodingCache, the part vLLM's suffix method uses
        def __init__(self):
            self.active_requests, self.cached_requests = {"r3"}, {"r1", "r2"}

        def stop_request(self, rid):
            self.active_requests.remove(rid)
            self.cached_requests.add(rid)

        def evict_cached_response(self, rid):
            self.cached_requests.remove(rid)

    vllm_suffix = SimpleNamespace(suffix_cache=SuffixCache())
    assert vllm_worker.forget_between_passes(SimpleNamespace(model_runner=SimpleNamespace(drafter=vllm_suffix))) == 3
    assert not vllm_suffix.suffix_cache.active_requests and not vllm_suffix.suffix_cache.cached_requests
    store, table = TokenStore(16), RequestTable()
    store.extend(0, [1, 2, 3])
    table.row("req-9", 2, [5, 6, 7])  # the previous pass's last request, not yet seen to leave
    ours = SimpleNamespace(cache=store, requests=table)
    assert vllm_worker.forget_between_passes(SimpleNamespace(model_runner=SimpleNamespace(drafter=ours))) == 2
    assert len(ours.cache) == 0 and ours.requests is not table and not ours.requests.live
    no_drafter = SimpleNamespace(model_runner=SimpleNamespace(drafter=SimpleNamespace()))  # ngram, eagle3
    assert vllm_worker.forget_between_passes(no_drafter) == 0


def test_prefill_prompt_and_hyspec_prefill_on_the_tiny_target(tiny):
    from hyspec.bench.prefill import hyspec_prefill, long_prompt

    assert long_prompt([(1, 2, 3), (4, 5)], 7) == [1, 2, 3, 4, 5, 1, 2]  # the prompts end to end, cut at N
    with pytest.raises(ValueError, match="no prompt tokens"):
        long_prompt([()], 4)
    figure = hyspec_prefill(tiny["target"], BenchSettings(), list(range(3, 67)), repeats=2)
    assert figure["engine"] == "hyspec" and len(figure["tokens_per_s"]["runs"]) == 2  # the untimed first run dropped
