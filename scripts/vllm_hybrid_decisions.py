"""How often vLLM + hyspec's hybrid drafts at each batch size, and whether its tokens are vLLM plain's.

Runs in vLLM's venv (scripts/vllm_venv.sh), one engine at a time, each in a child process of its own:

    .vllm-venv/bin/python scripts/vllm_hybrid_decisions.py --model DIR --out decisions.json \
        [--batch-sizes 1,8,32] [--max-tokens 48] [--passes 2] [--workload humaneval|agentic] [--num-prompts N]
        [--engines plain,hyspec[,ngram]] [-k 4] [--eager]

For each engine (vLLM plain, vLLM + hyspec with ``{"method": "hybrid"}``, optionally vLLM's ngram) and each batch
size in turn, it decodes ``--passes`` passes of ``--num-prompts`` prompts (default: the batch size) in waves of the
batch size (temperature 0, EOS ignored; agentic: hyspec bench's stream, re-runs after their originals), and records
the seconds of each pass and, for hyspec, the proposer's own counters over the pass (read from vLLM's worker,
core/vllm/proposer.py ``stats``): steps that sent drafts and steps that did not, per batch-size class, draft
tokens sent and cut, and its fit of vLLM's step cost.  Then it compares every output with vLLM plain's.  The
decisions do not depend on a quiet machine as much as the speeds do (the cost model sees the steps as they
run), but a loaded machine does change what a token costs: say what else ran.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any


def proposer_state(worker: Any) -> dict[str, Any]:
    """Run in vLLM's worker (collective_rpc): hyspec's proposer's counters and cost fit."""
    drafter = getattr(getattr(worker, "model_runner", None), "drafter", None)
    hybrid = getattr(drafter, "hybrid", None)
    return {"stats": dict(getattr(drafter, "stats", {}) or {}),
            "cost": hybrid.cost_terms() if hybrid is not None else {}}


def forget(worker: Any) -> None:
    """Between passes: hyspec's proposer forgets finished responses (a pass must not copy the previous one's);
    what the hybrid learnt (cost, acceptance) is kept, as a server keeps it."""
    from hyspec.bench.vllm_worker import forget_between_passes

    forget_between_passes(worker)


def prompts_for(workload: str, count: int, model: str) -> list[str]:
    if workload == "humaneval":
        from hyspec.bench.prompts import humaneval_prompts

        prompts = humaneval_prompts()
        return [prompts[i % len(prompts)] for i in range(count)]
    if workload == "agentic":  # rendered through the chat template, as hyspec bench sends them
        from hyspec.bench.workloads import workload_requests
        from hyspec.model.tokenizer import Tokenizer

        return [text for text, _ in workload_requests("agentic", Tokenizer(model).apply_chat_template, count)]
    raise SystemExit(f"--workload {workload!r}: humaneval or agentic")


def run_engine(args: argparse.Namespace, kind: str) -> dict[str, Any]:
    """One engine's passes (in this process: the parent starts one child per engine)."""
    if kind == "hyspec":
        path = os.path.join(tempfile.mkdtemp(prefix="hyspec-decisions-"), "options.json")
        with open(path, "w", encoding="utf-8") as f:
            json.dump({"method": "hybrid"}, f)
        os.environ["HYSPEC_VLLM_CONFIG"] = path
    from vllm import LLM, SamplingParams

    spec = {"hyspec": {"method": "custom_class", "model": "hyspec.vllm.HyspecProposer", "num_speculative_tokens": args.k},
            "ngram": {"method": "ngram", "num_speculative_tokens": args.k}}.get(kind)
    llm = LLM(model=args.model, dtype="float32", max_model_len=1024, gpu_memory_utilization=args.memory_fraction,
              seed=0, speculative_config=spec, enable_prefix_caching=True, enforce_eager=args.eager)
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    out: dict[str, Any] = {"kind": kind, "passes": []}
    for batch in [int(b) for b in args.batch_sizes.split(",")]:
        prompts = prompts_for(args.workload, args.num_prompts or batch, args.model)
        for index in range(args.passes):
            llm.reset_prefix_cache()
            if kind == "hyspec":
                llm.collective_rpc(forget)
                before = llm.collective_rpc(proposer_state)[0]["stats"]
            start = time.perf_counter()
            outputs = [list(o.outputs[0].token_ids) for i in range(0, len(prompts), batch)
                       for o in llm.generate(prompts[i:i + batch], params, use_tqdm=False)]
            seconds = time.perf_counter() - start
            doc: dict[str, Any] = {"batch": batch, "pass": index, "seconds": seconds,
                                   "tokens_per_second": len(prompts) * args.max_tokens / seconds, "outputs": outputs}
            if kind == "hyspec":
                state = llm.collective_rpc(proposer_state)[0]
                doc["stats"] = {k: v - before.get(k, 0) for k, v in state["stats"].items() if v != before.get(k, 0)}
                doc["cost_fit"] = state["cost"]
            out["passes"].append(doc)
            print(f"{kind} batch {batch} pass {index}: {doc['tokens_per_second']:.1f} tok/s", file=sys.stderr)
    return out


def summary(parts: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    reference = {(p["batch"], p["pass"]): p for p in parts["plain"]["passes"]}
    ngram = {(p["batch"], p["pass"]): p for p in parts.get("ngram", {}).get("passes", [])}
    for p in parts["hyspec"]["passes"]:
        ref = reference[(p["batch"], p["pass"])]
        drafted = sum(v for k, v in p["stats"].items() if k.startswith("hybrid_batch_") and k.endswith("_drafted"))
        undrafted = sum(v for k, v in p["stats"].items() if k.startswith("hybrid_batch_") and k.endswith("_plain"))
        rows.append({"batch": p["batch"], "pass": p["pass"], "steps_drafted": drafted, "steps_plain": undrafted,
                     "drafted_share": drafted / max(1, drafted + undrafted),
                     "draft_tokens_sent": p["stats"].get("drafted_tokens", 0),
                     "draft_tokens_cut": p["stats"].get("hybrid_cut_tokens", 0),
                     "accepted_tokens": p["stats"].get("accepted_tokens", 0),
                     "propose_seconds": p["stats"].get("propose_seconds", 0.0),
                     "identical_to_vllm_plain": p["outputs"] == ref["outputs"],
                     "tok_s_plain": ref["tokens_per_second"], "tok_s_hyspec": p["tokens_per_second"],
                     "cost_fit": p["cost_fit"]})
        other = ngram.get((p["batch"], p["pass"]))
        if other is not None:
            rows[-1].update(tok_s_ngram=other["tokens_per_second"],
                            ngram_identical_to_vllm_plain=other["outputs"] == ref["outputs"])
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="a Hugging Face directory (hyspec export-hf)")
    parser.add_argument("--out", required=True)
    parser.add_argument("--batch-sizes", default="1,8,32")
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--passes", type=int, default=2)
    parser.add_argument("-k", type=int, default=4, help="num_speculative_tokens")
    parser.add_argument("--workload", default="humaneval")
    parser.add_argument("--num-prompts", type=int, default=0, help="prompts per pass (0: the batch size)")
    parser.add_argument("--engines", default="plain,hyspec", help="plain and hyspec, and ngram if wanted")
    parser.add_argument("--memory-fraction", type=float, default=0.12)
    parser.add_argument("--eager", action="store_true",
                        help="no torch.compile (starts in seconds, not minutes; slower steps: compare within a run)")
    parser.add_argument("--engine", choices=("plain", "hyspec", "ngram"), help=argparse.SUPPRESS)  # a child's
    parser.add_argument("--part", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.engine:
        with open(args.part, "w", encoding="utf-8") as f:
            json.dump(run_engine(args, args.engine), f)
        return 0
    parts = {}
    # the proposer's counters are read with collective_rpc of a function of this script: vLLM pickles it only
    # when allowed (it runs in vLLM's own worker, which this script started)
    env = dict(os.environ, VLLM_ALLOW_INSECURE_SERIALIZATION="1")
    for kind in args.engines.split(","):  # one engine alive at a time; a part already written is reused
        part = args.out + f".{kind}.part"
        if not os.path.exists(part):
            subprocess.run([sys.executable, __file__, *sys.argv[1:], "--engine", kind, "--part", part + ".tmp"],
                           check=True, env=env)
            os.replace(part + ".tmp", part)
        with open(part, encoding="utf-8") as f:
            parts[kind] = json.load(f)
    rows = summary(parts)
    doc = {"kind": "vllm-hybrid-decisions", "settings": {k: v for k, v in vars(args).items()
                                                         if k not in ("engine", "part")}, "rows": rows}
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1)
    for kind in parts:
        os.unlink(args.out + f".{kind}.part")
    for r in rows:
        print(f"batch {r['batch']:>2} pass {r['pass']}: drafted {r['steps_drafted']}/{r['steps_drafted'] + r['steps_plain']}"
              f" steps, sent {r['draft_tokens_sent']} cut {r['draft_tokens_cut']} accepted {r['accepted_tokens']};"
              f" identical {r['identical_to_vllm_plain']}; {r['tok_s_hyspec']:.1f} vs plain {r['tok_s_plain']:.1f}"
              f" (ngram {r.get('tok_s_ngram', float('nan')):.1f}) tok/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
