"""lm-evaluation-harness as a real client: ``local-completions`` against ``hyspec serve`` beside lm-eval's
own ``hf`` backend on the same weights, per-request log-likelihoods side by side.

The tasks are ours (``docs/lm_eval/tasks``: a multiple-choice log-likelihood task and a
``generate_until`` task over data that ships in the repository), so nothing is downloaded.
``local-completions`` sends token-id prompts with ``echo`` + ``logprobs=1`` + ``max_tokens=1`` and
sums ``token_logprobs[ctxlen:-1]``; ``hf`` scores the same token ids with transformers' forward.  Both
use one tokenizer (the model directory's, or transformers' reading of the GGUF), so the figures
compare the engines and nothing else.  Needs ``pip install 'lm-eval[api]'`` (``hyspec[eval]``).
"""
from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
TASKS_DIR = REPO_ROOT / "docs" / "lm_eval" / "tasks"
MC_TASK, GEN_TASK = "hyspec_python_mc", "hyspec_arith_gen"


def hf_tokenizer_dir(model: Path, out: Path) -> Path:
    """A Hugging Face tokenizer directory for ``model`` (a GGUF is read by transformers, once)."""
    if model.suffix.lower() != ".gguf":
        return model
    if not (out / "tokenizer_config.json").is_file():
        from transformers import AutoTokenizer

        AutoTokenizer.from_pretrained(str(model.parent), gguf_file=model.name).save_pretrained(str(out))
    return out


def hf_model_args(model: Path, dtype: str = "float32") -> str:
    if model.suffix.lower() == ".gguf":
        return f"pretrained={model.parent},gguf_file={model.name},dtype={dtype}"
    return f"pretrained={model},dtype={dtype}"


def evaluate(model: str, model_args: str, tasks: list[str], limit: int | None, batch_size: int = 1,
             **kwargs: Any) -> dict[str, Any]:
    """``lm_eval.simple_evaluate`` on our tasks (run from the repository root: the YAMLs' data paths)."""
    if not TASKS_DIR.is_dir():
        raise FileNotFoundError(f"{TASKS_DIR} not found: the lm-eval tasks live in the hyspec repository")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    import lm_eval
    from lm_eval.tasks import TaskManager

    with contextlib.chdir(REPO_ROOT):
        return lm_eval.simple_evaluate(model=model, model_args=model_args, tasks=tasks, limit=limit,
                                       batch_size=batch_size, task_manager=TaskManager(include_path=str(TASKS_DIR)),
                                       log_samples=True, **kwargs)


def loglikelihoods(result: dict[str, Any], task: str) -> dict[tuple[int, int], tuple[float, bool]]:
    """(doc id, choice) -> (log-likelihood, is_greedy) from a log_samples result."""
    out = {}
    for sample in result["samples"][task]:
        for choice, resp in enumerate(sample["resps"]):
            ll, greedy = resp[0]
            out[(sample["doc_id"], choice)] = (float(ll), str(greedy) == "True")
    return out


def generations(result: dict[str, Any], task: str) -> dict[int, str]:
    return {s["doc_id"]: s["resps"][0][0] for s in result["samples"][task]}


def side_by_side(model: Path, engine_args: dict[str, Any], work: Path, limit: int | None = None,
                 speculative_config: dict | None = None, max_length: int = 2048) -> dict[str, Any]:
    """Run both tasks through hyspec serve (local-completions) and the mc task through ``hf``; compare."""
    # fastapi and uvicorn: the serve extra, imported once a comparison runs
    from hyspec.server.app import create_app
    from hyspec.server.launcher import BackgroundServer

    work.mkdir(parents=True, exist_ok=True)
    tokenizer = hf_tokenizer_dir(model, work / "hf-tokenizer")
    args = {"model": str(model), **engine_args, "speculative_config": speculative_config}
    t0 = time.perf_counter()
    server = BackgroundServer(create_app(args, served_model_name="hyspec")).start()
    try:
        api = evaluate("local-completions",
                       f"model=hyspec,base_url={server.url}/v1/completions,tokenizer={tokenizer},"
                       f"tokenizer_backend=huggingface,num_concurrent=1,max_retries=1,max_length={max_length}",
                       [MC_TASK, GEN_TASK], limit)
    finally:
        server.stop()
    api_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    hf = evaluate("hf", hf_model_args(model), [MC_TASK, GEN_TASK], limit, device="cpu")
    hf_s = time.perf_counter() - t0
    ours, theirs = loglikelihoods(api, MC_TASK), loglikelihoods(hf, MC_TASK)
    if ours.keys() != theirs.keys():
        raise AssertionError(f"the two runs scored different requests: {sorted(ours.keys() ^ theirs.keys())[:4]}")
    rows = [{"doc_id": d, "choice": c, "hyspec": ours[(d, c)][0], "hf": theirs[(d, c)][0],
             "abs_diff": abs(ours[(d, c)][0] - theirs[(d, c)][0]),
             "greedy_hyspec": ours[(d, c)][1], "greedy_hf": theirs[(d, c)][1]} for d, c in sorted(ours)]
    gen_ours, gen_theirs = generations(api, GEN_TASK), generations(hf, GEN_TASK)

    def metrics(result: dict[str, Any]) -> dict[str, dict[str, float]]:
        return {task: {k: v for k, v in values.items() if isinstance(v, (int, float)) and "stderr" not in k}
                for task, values in result["results"].items()}

    return {
        "model": str(model), "engine_args": engine_args, "speculative_config": speculative_config, "limit": limit,
        "seconds": {"local-completions (hyspec serve)": round(api_s, 1), "hf": round(hf_s, 1)},
        "metrics": {"local-completions (hyspec serve)": metrics(api), "hf": metrics(hf)},
        "loglikelihood_requests": len(rows),
        "max_abs_loglikelihood_diff": max(r["abs_diff"] for r in rows),
        "is_greedy_agree": sum(r["greedy_hyspec"] == r["greedy_hf"] for r in rows),
        "generate_until_identical": sum(gen_ours[d] == gen_theirs.get(d) for d in gen_ours),
        "generate_until_docs": len(gen_ours),
        "rows": rows,
        "generations": [{"doc_id": d, "hyspec": gen_ours[d], "hf": gen_theirs.get(d)} for d in sorted(gen_ours)],
    }
