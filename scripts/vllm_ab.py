"""vLLM plain against vLLM + hyspec, interleaved in one process (issue 46: >= 0.97x vLLM plain where drafting
does not pay).

    VLLM_PY=$(bash scripts/vllm_venv.sh)
    VLLM_USE_AOT_COMPILE=0 $VLLM_PY scripts/vllm_ab.py /tmp/vllmwork/sm-export --out ab.json \
        [--rows chat:8,chat:32,agentic:8:8,humaneval:8,humaneval:32] [--engines hybrid] [--rounds 4]

Why: vLLM's CPU build drifts 10-20 % over minutes, more than the 3 % the floor allows, so engines measured one
after another (as ``hyspec bench`` runs its vLLM rows) compare the drift as much as the proposer.  Here vLLM
plain stays loaded and each compared engine is loaded beside it (two engines alive at most: each reserves
``--memory-fraction`` of RAM); every round runs the same passes on both, the order alternating round by round
(ABBA), and a row reports the median of the per-round ratios as well as the ratio of median rates.

The workloads are ``hyspec bench``'s, as docs/results/2026-12-06/vllm-bench/run_full.sh runs them: the first
``--num-prompts`` (8) requests of the workload (hyspec.bench.workloads, through the model's chat template where
the workload uses one), cycled to whole waves of the batch size, ``--max-tokens`` (48) each, EOS ignored,
temperature 0; a row ``workload:batch[:k]`` (k: num_speculative_tokens, default 4; the bench's agentic run used
8).  Before every pass the prefix cache is emptied and hyspec's proposer forgets finished responses
(hyspec.bench.vllm_worker.forget_between_passes, as the bench does); what the hybrid learnt is kept, as a server
keeps it.  An untimed warm-up wave (4 tokens) per engine and row comes first.

Engines compared with vLLM plain (``--engines``), to find where a loss comes from:

* ``hybrid``: vLLM + hyspec, ``{"method": "hybrid"}`` (what the bench's ``vllm_hyspec`` row runs);
* ``hybrid-off``: the same proposer doing all its work (every arm drafts every row, the plan is computed) with
  ``min_gain`` 10 and no exploration, so it never sends a draft: hyspec's own cost in vLLM's step;
* ``never``: vLLM's speculative path with a proposer that returns no drafts and does nothing else
  (:class:`NeverDraft`): the cost of vLLM's spec-decode machinery itself, nothing of hyspec's.

For the hyspec engines each pass also records the proposer's counters (core/vllm/proposer.py ``stats``: its
time in ``propose`` per call and as a share of the pass, steps that sent drafts, tokens sent and accepted), and
the run ends with the hybrid's learnt steps (rows, draft tokens, seconds) and its cost fit.  Every output is
compared with vLLM plain's.  ``--smoke`` runs one row, two rounds, 8 tokens: proof that it works, no figure.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HYSPEC_CLASS = "hyspec.vllm.HyspecProposer"
#: engine -> hyspec options (None: :class:`NeverDraft`, not hyspec)
ENGINES: dict[str, dict[str, Any] | None] = {
    "hybrid": {"method": "hybrid"},
    "hybrid-off": {"method": "hybrid", "min_gain": 10.0, "explore_interval": 0},
    "never": None,
}
DEFAULT_ROWS = "chat:8,chat:32,agentic:8:8,humaneval:8,humaneval:32"
WARMUP_TOKENS = 4


class NeverDraft:
    """A ``custom_class`` proposer that never drafts: vLLM's speculative step with zero draft tokens."""

    def __init__(self, vllm_config: Any):
        self.calls = 0

    def load_model(self, *args: Any, **kwargs: Any) -> None:
        return None

    def propose(self, sampled_token_ids: Any, *args: Any, **kwargs: Any) -> list[list[int]]:
        self.calls += 1
        return [[] for _ in sampled_token_ids]


def proposer_state(worker: Any) -> dict[str, Any]:
    """Run in vLLM's worker (collective_rpc): the proposer's counters, and the hybrid's learnt steps and fit."""
    drafter = getattr(getattr(worker, "model_runner", None), "drafter", None)
    hybrid = getattr(drafter, "hybrid", None)
    return {"stats": dict(getattr(drafter, "stats", None) or {"propose_calls": getattr(drafter, "calls", 0)}),
            "steps": list(getattr(hybrid, "step_log", ())) if hybrid is not None else [],
            "cost": hybrid.cost_terms() if hybrid is not None else {}}


def forget(worker: Any) -> None:
    """Between passes, as hyspec bench does: hyspec's proposer forgets finished responses and live requests."""
    from hyspec.bench.vllm_worker import forget_between_passes

    forget_between_passes(worker)


def parse_rows(text: str) -> list[tuple[str, int, int]]:
    """``workload:batch[:k]`` items, comma-separated -> (workload, batch, k)."""
    from hyspec.bench.workloads import WORKLOADS

    rows = []
    for item in filter(None, (s.strip() for s in text.split(","))):
        parts = item.split(":")
        if len(parts) not in (2, 3) or parts[0] not in WORKLOADS or not all(p.isdigit() and int(p) > 0
                                                                           for p in parts[1:]):
            raise SystemExit(f"--rows {item!r}: want workload:batch[:k], workload one of {', '.join(WORKLOADS)}, "
                             "batch and k positive integers")
        rows.append((parts[0], int(parts[1]), int(parts[2]) if len(parts) == 3 else 4))
    if not rows:
        raise SystemExit("--rows: no row given")
    return rows


def prompts_for(workload: str, num_prompts: int, batch: int, model: str) -> list[list[int]]:
    """The bench's prompts of ``workload`` (token ids), cycled to whole waves of ``batch``."""
    from hyspec.bench.workloads import workload_requests
    from hyspec.model.tokenizer import Tokenizer

    tok = Tokenizer(Path(model))
    ids = [tok.encode(text, add_special_tokens=not templated)
           for text, templated in workload_requests(workload, tok.apply_chat_template, num_prompts)]
    count = -(-len(ids) // batch) * batch
    return [ids[i % len(ids)] for i in range(count)]


class Engines:
    """vLLM engines by name, loaded and closed on demand (two alive at most, as the caller keeps it)."""

    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.live: dict[str, Any] = {}
        self.load_seconds: dict[str, float] = {}

    def load(self, name: str, kind: str, k: int) -> Any:
        from vllm import LLM

        spec = None
        if kind != "plain":
            options = ENGINES[kind]
            model = HYSPEC_CLASS if options is not None else f"{Path(__file__).stem}.NeverDraft"
            spec = {"method": "custom_class", "model": model, "num_speculative_tokens": k}
            if options is not None:  # read by hyspec's proposer in the engine process vLLM starts now
                path = Path(tempfile.mkdtemp(prefix="hyspec-ab-")) / "options.json"
                path.write_text(json.dumps(options))
                os.environ["HYSPEC_VLLM_CONFIG"] = str(path)
        start = time.perf_counter()
        llm = LLM(model=self.args.model, dtype="float32", max_model_len=self.args.max_model_len,
                  gpu_memory_utilization=self.args.memory_fraction, seed=0, speculative_config=spec,
                  enable_prefix_caching=True)
        os.environ.pop("HYSPEC_VLLM_CONFIG", None)
        self.load_seconds[name] = round(time.perf_counter() - start, 1)
        self.live[name] = llm
        print(f"[ab] loaded {name} in {self.load_seconds[name]} s", file=sys.stderr, flush=True)
        return llm

    def close(self, name: str) -> None:
        llm = self.live.pop(name)
        llm.llm_engine.engine_core.shutdown()
        del llm
        gc.collect()


def run_pass(llm: Any, speculative: bool, waves: list[list[list[int]]], max_tokens: int) -> dict[str, Any]:
    """One untimed reset, then the waves timed; the outputs, seconds and (speculative) the proposer's deltas."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    llm.reset_prefix_cache()
    before = None
    if speculative:
        llm.collective_rpc(forget)
        before = llm.collective_rpc(proposer_state)[0]["stats"]
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    start = time.perf_counter()
    outputs = [list(o.outputs[0].token_ids) for wave in waves
               for o in llm.generate([TokensPrompt(prompt_token_ids=p) for p in wave], params, use_tqdm=False)]
    seconds = time.perf_counter() - start
    doc: dict[str, Any] = {"seconds": seconds, "tok_per_s": sum(map(len, outputs)) / seconds, "outputs": outputs}
    if before is not None:
        after = llm.collective_rpc(proposer_state)[0]["stats"]
        doc["stats"] = {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}
    return doc


def proposer_summary(passes: list[dict[str, Any]]) -> dict[str, Any]:
    """The hyspec engine's counters over a row's timed passes."""
    total: dict[str, float] = {}
    for p in passes:
        for key, value in p.get("stats", {}).items():
            total[key] = total.get(key, 0) + value
    calls = total.get("propose_calls", 0)
    wall = sum(p["seconds"] for p in passes)
    drafted = sum(v for k, v in total.items() if k.startswith("hybrid_batch_") and k.endswith("_drafted"))
    plain = sum(v for k, v in total.items() if k.startswith("hybrid_batch_") and k.endswith("_plain"))
    out: dict[str, Any] = {"propose_calls": int(calls), "pass_seconds": round(wall, 3)}
    if "propose_seconds" in total:
        out["propose_ms_per_call"] = round(1e3 * total["propose_seconds"] / max(1, calls), 3)
        out["propose_share_of_wall"] = round(total["propose_seconds"] / wall, 4)
    if calls:
        out["wall_ms_per_step"] = round(1e3 * wall / calls, 2)  # prefill steps included
    if drafted + plain:
        out.update(steps_drafted=int(drafted), steps_plain=int(plain),
                   draft_tokens_sent=int(total.get("drafted_tokens", 0)),
                   draft_tokens_cut=int(total.get("hybrid_cut_tokens", 0)),
                   accepted_tokens=int(total.get("accepted_tokens", 0)),
                   wave_steps=int(total.get("hybrid_wave_steps", 0)),
                   wave_cut_tokens=int(total.get("hybrid_wave_cut_tokens", 0)),
                   plain_path_steps=int(total.get("plain_path_steps", 0)))
    return out


def step_fit(steps: list[list[float]]) -> dict[str, Any]:
    """Least squares over the hybrid's learnt steps: seconds ~ fixed + per_token x (rows + drafts) + verify x
    [the step verified drafts].  ``verify`` is the fixed cost of a verifying step that a line in the tokens
    scored (the hybrid's cost model) does not see; None where the steps cannot tell (no drafted or no plain
    steps)."""
    import numpy as np

    if len(steps) < 4:
        return {"steps": len(steps)}
    rows = np.array([s[0] for s in steps], dtype=float)
    drafts = np.array([s[1] for s in steps], dtype=float)
    seconds = np.array([s[2] for s in steps], dtype=float)
    verifying = (drafts > 0).astype(float)
    out: dict[str, Any] = {"steps": len(steps), "verifying_steps": int(verifying.sum())}
    columns = [np.ones_like(rows), rows + drafts]
    names = ["fixed", "per_token"]
    if 0 < verifying.sum() < len(steps):
        columns.append(verifying)
        names.append("verify")
    x = np.stack(columns, axis=1)
    coef, *_ = np.linalg.lstsq(x, seconds, rcond=None)
    out.update({n: round(float(c), 5) for n, c in zip(names, coef)})
    residual = seconds - x @ coef
    out["rms_residual"] = round(float(np.sqrt(np.mean(residual ** 2))), 5)
    return out


def measure_row(args: argparse.Namespace, plain: Any, other: Any, name: str, row: tuple[str, int, int]
                ) -> dict[str, Any]:
    workload, batch, k = row
    prompts = prompts_for(workload, args.num_prompts, batch, args.model)
    waves = [prompts[i:i + batch] for i in range(0, len(prompts), batch)]
    engines = {"plain": (plain, False), name: (other, True)}
    for llm, speculative in engines.values():  # untimed warm-up wave
        run_pass(llm, speculative, waves[:1], min(WARMUP_TOKENS, args.max_tokens))
    rates: dict[str, list[float]] = {n: [] for n in engines}
    passes: list[dict[str, Any]] = []
    differing = 0
    for r in range(args.rounds):
        order = list(engines) if r % 2 == 0 else list(reversed(engines))
        done = {}
        for n in order:
            llm, speculative = engines[n]
            done[n] = run_pass(llm, speculative, waves, args.max_tokens)
            rates[n].append(done[n]["tok_per_s"])
        differing += sum(a != b for a, b in zip(done["plain"]["outputs"], done[name]["outputs"]))
        passes.append({k_: v for k_, v in done[name].items() if k_ != "outputs"})
        print(f"[ab] {workload} batch {batch} k {k} round {r}: plain {rates['plain'][-1]:.1f}, {name} "
              f"{rates[name][-1]:.1f} tok/s ({rates[name][-1] / rates['plain'][-1]:.3f}x)", file=sys.stderr, flush=True)
    med = {n: statistics.median(v) for n, v in rates.items()}
    paired = [b / a for a, b in zip(rates["plain"], rates[name])]
    return {"workload": workload, "batch": batch, "k": k, "engine": name, "requests": len(prompts),
            "tok_per_s": {n: [round(x, 2) for x in v] for n, v in rates.items()},
            "median_tok_per_s": {n: round(v, 2) for n, v in med.items()},
            "ratio_of_medians": round(med[name] / med["plain"], 4),
            "median_paired_ratio": round(statistics.median(paired), 4),
            "paired_ratios": [round(x, 4) for x in paired],
            "requests_differing_from_plain": differing,
            "proposer": proposer_summary(passes) if name != "plain" else None}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model", help="the target as a Hugging Face directory (hyspec export-hf)")
    p.add_argument("--rows", default=DEFAULT_ROWS, help=f"workload:batch[:k], comma-separated (default {DEFAULT_ROWS})")
    p.add_argument("--engines", default="hybrid", help=f"compared with vLLM plain, in turn: {', '.join(ENGINES)}")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--num-prompts", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--max-model-len", type=int, default=4096)
    p.add_argument("--memory-fraction", type=float, default=0.12,
                   help="vLLM's gpu_memory_utilization per engine (on CPU: the share of RAM it reserves)")
    p.add_argument("--smoke", action="store_true", help="chat:8 only, 2 rounds, 8 tokens: proof that it runs")
    p.add_argument("--out", required=True)
    a = p.parse_args()
    if a.smoke:
        a.rows, a.rounds, a.max_tokens = "chat:8", 2, 8
    rows = parse_rows(a.rows)
    names = [n.strip() for n in a.engines.split(",") if n.strip()]
    unknown = [n for n in names if n not in ENGINES]
    if unknown or not names:
        raise SystemExit(f"--engines {a.engines!r}: choose among {', '.join(ENGINES)}")
    if a.rounds < 1:
        raise SystemExit("--rounds must be >= 1")
    # the proposer's counters travel back by collective_rpc of this script's functions: vLLM pickles them only
    # when allowed; NeverDraft is imported by name in vLLM's engine process, from this script's folder
    os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
    here = str(Path(__file__).resolve().parent)
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")]))
    import vllm

    engines = Engines(a)
    started = time.time()
    plain = engines.load("plain", "plain", 0)
    results, learnt = [], {}
    for name in names:
        for k in sorted({k for *_, k in rows}):
            label = f"{name}-k{k}"
            other = engines.load(label, name, k)
            for row in (r for r in rows if r[2] == k):
                results.append(measure_row(a, plain, other, name, row))
                print(json.dumps({x: y for x, y in results[-1].items() if x not in ("tok_per_s", "proposer")}),
                      flush=True)
            state = other.collective_rpc(proposer_state)[0]
            steps = [[r, d, round(s, 5)] for r, d, s in state["steps"]]
            learnt[label] = {"steps": steps, "cost_fit": state["cost"], "step_fit": step_fit(steps)}
            print(f"[ab] {label} step fit: {learnt[label]['step_fit']}", file=sys.stderr, flush=True)
            engines.close(label)
    engines.close("plain")
    doc = {"kind": "vllm-ab", "vllm": vllm.__version__, "machine": {"processor": platform.processor() or
                                                                      platform.machine(), "cpus": os.cpu_count(),
                                                                      "load_average": os.getloadavg()},
           "settings": {k: v for k, v in vars(a).items()}, "utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "minutes": round((time.time() - started) / 60, 1), "load_seconds": engines.load_seconds,
           "rows": results, "learnt": learnt}
    Path(a.out).write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
