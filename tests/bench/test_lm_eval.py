"""lm-evaluation-harness against the real `hyspec serve` (local-completions) and its own hf backend on the
same tiny checkpoint: both tasks of docs/lm_eval/tasks run end to end, log-likelihoods agree.

The full run on the default model: scripts/lm_eval_side_by_side.py (docs/results/2026-12-01/lm_eval/).
"""
from __future__ import annotations

import pytest

from tests.model.tiny_checkpoint import make_checkpoint

pytest.importorskip("lm_eval")
pytest.importorskip("tenacity")  # lm-eval's API models need its [api] extra


def test_local_completions_against_hyspec_equals_the_hf_backend(tmp_path):
    from hyspec.bench.vs_lm_eval import side_by_side

    model = tmp_path / "tiny"
    make_checkpoint(model)
    engine = {"dtype": "float32", "backend": "cpu", "kv_cache_bytes": 8 << 20, "max_model_len": 256}
    spec = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 2}
    report = side_by_side(model, engine, tmp_path / "work", limit=3, max_length=256, speculative_config=spec)
    assert report["loglikelihood_requests"] == sum(4 for _ in range(3))  # 3 questions x 4 choices
    assert report["max_abs_loglikelihood_diff"] < 1e-4, report["rows"]
    assert report["is_greedy_agree"] == report["loglikelihood_requests"]
    ours, theirs = (report["metrics"][k] for k in ("local-completions (hyspec serve)", "hf"))
    assert ours["hyspec_python_mc"] == theirs["hyspec_python_mc"]
    # generate_until went through the server too (stop strings applied there), greedy on both sides
    assert report["generate_until_docs"] == 3 and report["generate_until_identical"] == 3, report["generations"]
