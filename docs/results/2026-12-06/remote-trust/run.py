"""What trusting the workers' q buys: acceptance of remote drafts at T = 0.8, point proposals vs the worker's q.

    .venv/bin/python docs/results/2026-12-06/remote-trust/run.py                 # Ray workers, 16 prompts x 2
    .venv/bin/python docs/results/2026-12-06/remote-trust/run.py --transport inprocess --prompts 4  # a smoke run

The default model (SmolLM2-135M-Instruct, Q4_1) with its committed draft_model drafter
(assets/smollm2-draft-model) drafting on remote CPU workers (a local Ray, or DraftHosts on threads of this
process with ``--transport inprocess``: the same host code, no Ray).  Each mode -- ``remote.trust_worker_q``
false (the default: drafts verified as point proposals) and true (verified with the worker's q) -- gets the
same seeded requests (HumanEval and chat prompts, temperature 0.8, no top-k/top-p).  The draft deadline is
5 s and the health pings patient so that every draft is the worker's and verified whatever the box's load:
acceptance, not speed, is what is measured.
Reported per mode: accepted per drafted token, mean acceptance length (emitted tokens per speculative step),
and the bytes a step's reply carried (q rows travel only in trusted mode).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--transport", choices=("ray", "inprocess"), default="ray")
    p.add_argument("--prompts", type=int, default=16, help="per workload (humaneval and chat)")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--k", type=int, default=4, help="num_speculative_tokens")
    p.add_argument("--temperature", type=float, default=0.8)
    p.add_argument("--json", default=str(HERE / "results.json"))
    return p.parse_args()


@contextlib.contextmanager
def remote_placement(transport: str):
    """Route draft_placement "remote" to build_remote_proposer, on Ray or on in-process workers."""
    import dataclasses

    import hyspec.spec.decoder as decoder
    from hyspec.remote.factory import build_remote_proposer, worker_init
    from hyspec.remote.transport import InProcessHandle
    from hyspec.remote.worker import build_host

    original = decoder.build_proposer

    def build(engine, spec):
        if getattr(spec.config, "draft_placement", "local") != "remote":
            return original(engine, spec)
        handles = None
        if transport == "inprocess":
            init = worker_init(engine, dataclasses.replace(spec))
            handles = [InProcessHandle(lambda: build_host(init))]
        return build_remote_proposer(engine, spec, handles=handles)

    decoder.build_proposer = build
    try:
        yield
    finally:
        decoder.build_proposer = original


def prompts(n: int) -> list[list[int]]:
    from hyspec.bench.interleaved_ab import workload_prompts

    return workload_prompts("humaneval", n) + workload_prompts("chat", n)


def run_mode(trusted: bool, args: argparse.Namespace, ids: list[list[int]]) -> dict:
    from hyspec import LLM, SamplingParams
    from hyspec.assets import default_drafter, default_model

    cfg = {"method": "draft_model", "model": str(default_drafter("draft_model")), "num_speculative_tokens": args.k,
           "draft_placement": "remote", "controller": {"enabled": False, "profile_at_startup": False},
           # patient pings too: on a loaded box a slow ping would fail the worker over to local ngram drafts
           "remote": {"draft_deadline_ms": 5000, "ping_interval_ms": 1000, "max_missed_pings": 60,
                      "trust_worker_q": trusted}}
    with remote_placement(args.transport):
        llm = LLM(str(default_model()), kv_cache_bytes=256 << 20, max_model_len=2048, speculative_config=cfg)
    rp = llm.engine.spec.proposers["draft_model"]
    try:
        params = [SamplingParams(temperature=args.temperature, seed=1000 + i, max_tokens=args.max_tokens,
                                 ignore_eos=True) for i in range(len(ids))]
        t = time.perf_counter()
        outs = llm.generate(ids, params)
        seconds = time.perf_counter() - t
        totals = llm.engine.spec.metrics.snapshot()["totals"]
        remote = rp.metrics.snapshot()
    finally:
        rp.close()
    return {"trust_worker_q": trusted, "requests": len(ids),
            "output_tokens": sum(len(o.outputs[0].token_ids) for o in outs),
            "speculative_steps": totals["drafts"], "draft_tokens": totals["draft_tokens"],
            "accepted_tokens": totals["accepted_tokens"],
            "accepted_per_drafted": round(totals["accepted_tokens"] / max(totals["draft_tokens"], 1), 4),
            # emitted tokens per speculative step: the accepted ones plus the one the target adds
            "mean_acceptance_length": round(1 + totals["accepted_tokens"] / max(totals["drafts"], 1), 4),
            "accepted_per_position": totals["accepted_per_position"],
            "rejections": totals["rejections"],
            "remote_drafts": remote["drafts"], "invalid_drafts": remote["invalid_drafts"],
            "draft_timeouts": remote["draft_timeouts"],
            "bytes_received_per_call": round(remote["bytes_received"] / max(remote["calls"], 1)),
            "wall_seconds": round(seconds, 1)}


def main() -> None:
    args = parse_args()
    ids = prompts(args.prompts)
    load_before = os.getloadavg()
    rows = [run_mode(trusted, args, ids) for trusted in (False, True)]
    point, trusted = rows
    result = {
        "what": "acceptance of remote draft_model drafts at T=0.8: point proposals vs the worker's q",
        "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                    "load_before": load_before, "load_after": os.getloadavg()},
        "target": "SmolLM2-135M-Instruct Q4_1 (default model)", "drafter": "assets/smollm2-draft-model",
        "transport": args.transport, "temperature": args.temperature, "k": args.k, "max_tokens": args.max_tokens,
        "modes": rows,
        "trusted_over_point": {
            "accepted_per_drafted": round(trusted["accepted_per_drafted"] - point["accepted_per_drafted"], 4),
            "mean_acceptance_length": round(trusted["mean_acceptance_length"] / point["mean_acceptance_length"], 4)},
    }
    Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    for r in rows:
        print(f"trust_worker_q={str(r['trust_worker_q']).lower():5}  accepted/drafted {r['accepted_per_drafted']:.3f}"
              f"  acceptance length {r['mean_acceptance_length']:.3f}  reply bytes/call {r['bytes_received_per_call']}"
              f"  ({r['draft_tokens']} drafted, {r['speculative_steps']} steps)")
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
