"""LLM's lifecycle: close() and ``with``, two LLMs alive in one process, and scripts that end with status 0."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import pytest

from hyspec import LLM, SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
PROMPTS = ["def add(a, b):", "import os\n"]


def ids(outs):
    return [o.outputs[0].token_ids for o in outs]


def test_with_block_closes_and_a_closed_llm_says_so(tiny_ckpt, tiny_llm):
    expected = ids(tiny_llm.generate(PROMPTS, GREEDY))
    with LLM(str(tiny_ckpt[0]), dtype="float32", kv_cache_bytes=8 << 20,
             speculative_config={"method": "ngram", "num_speculative_tokens": 3}) as llm:
        assert ids(llm.generate(PROMPTS, GREEDY)) == expected
    with pytest.raises(RuntimeError, match="closed"):
        llm.generate(PROMPTS, GREEDY)
    llm.close()  # idempotent


def test_two_llms_alive_at_once_each_serve_their_own(tiny_ckpt, tiny_llm):
    expected = ids(tiny_llm.generate(PROMPTS, GREEDY))
    other = LLM(str(tiny_ckpt[0]), dtype="float32", kv_cache_bytes=8 << 20,
                speculative_config={"method": "ngram", "num_speculative_tokens": 3})
    for _ in range(2):  # interleaved: neither disturbs the other's engine or KV pool
        assert ids(other.generate(PROMPTS, GREEDY)) == expected
        assert ids(tiny_llm.generate(PROMPTS, GREEDY)) == expected
    assert other.engine.pool is not tiny_llm.engine.pool
    other.close()
    assert ids(tiny_llm.generate(PROMPTS, GREEDY)) == expected


def test_close_frees_the_kv_pool_and_hands_cached_memory_back(tiny_ckpt, tiny_llm, monkeypatch):
    expected = ids(tiny_llm.generate(PROMPTS, GREEDY))
    llm = LLM(str(tiny_ckpt[0]), dtype="float32", kv_cache_bytes=8 << 20)
    released = []
    monkeypatch.setattr(llm.engine.backend, "release_cached_memory", lambda: released.append(True))
    assert ids(llm.generate(PROMPTS, GREEDY)) == expected
    pool = llm.engine.pool
    assert pool.buffer.untyped_storage().nbytes() == pool.num_pages * pool.page_bytes
    llm.close()
    # the per-layer K/V views are still referenced (the runner, drafters), yet their memory is gone
    assert pool.buffer.untyped_storage().nbytes() == 0 and released == [True]
    llm.close()  # idempotent: frees nothing twice
    assert released == [True]
    assert ids(tiny_llm.generate(PROMPTS, GREEDY)) == expected  # the other engine's pool is untouched


def _hybrid_config(ckpt, rules):
    return {"method": "hybrid", "num_speculative_tokens": 3,
            "hybrid": {"methods": [{"method": "ngram", "prompt_lookup_min": 1, "prompt_lookup_max": 3}],
                       "rules_path": str(rules)}}


def test_no_hyspec_thread_outlives_close(tiny_ckpt, tmp_path):
    """The engine's dispatcher polls its rule file from the step (no thread); nothing hyspec started lives on."""
    rules = tmp_path / "rules.json"
    rules.write_text(json.dumps([{"method": "ngram"}]))
    before = set(threading.enumerate())
    llm = LLM(str(tiny_ckpt[0]), dtype="float32", kv_cache_bytes=8 << 20,
              speculative_config=_hybrid_config(tiny_ckpt, rules))
    llm.generate(PROMPTS, GREEDY)
    llm.close()
    left = [t.name for t in set(threading.enumerate()) - before if t.name.startswith("hyspec")]
    assert not left, left


def test_a_script_with_a_watched_rule_file_exits_cleanly(tiny_ckpt, tmp_path):
    rules = tmp_path / "rules.json"
    rules.write_text(json.dumps([{"method": "ngram"}]))
    script = tmp_path / "hybrid_exit.py"
    script.write_text(
        "from hyspec import LLM, SamplingParams\n"
        f"llm = LLM({str(tiny_ckpt[0])!r}, dtype='float32', kv_cache_bytes=8 << 20,\n"
        f"          speculative_config={_hybrid_config(tiny_ckpt, rules)!r})\n"
        "print(len(llm.generate(['def f(x):'], SamplingParams(temperature=0, max_tokens=8))[0].outputs[0].token_ids))\n")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=240,
                          env={**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "8" and "Traceback" not in done.stderr
