"""What a JSON schema costs per token, in one process: LLM.chat with and without the schema, interleaved.

For each method (plain decoding, suffix speculation) one `hyspec.LLM` on the default model (SmolLM2-135M-Instruct)
answers the same chat prompts (batch 1, temperature 0, the schema of run.py) in rounds; each round runs, prompt
by prompt, unconstrained, constrained, and -- with --baseline-rev -- constrained with the grammar processor of that
git revision (core/structured/processor.py as it was then, e.g. 42af014: before masks went through a
preallocated bitmask), so every variant sees the same load.  Reported: tokens/s per variant (median over rounds)
and the ratio constrained / unconstrained, plus whether every variant gave the same constrained tokens (the
baseline processor and suffix speculation must not change them).  The result is merged into results.json under
"grammar_overhead" (run.py keeps it).

    .venv/bin/python docs/results/2026-12-06/structured-outputs/overhead.py --baseline-rev 42af014
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
import types
from pathlib import Path

from run import SCHEMA, prompts  # noqa: E402  (this folder's run.py: the same schema and prompts)

from hyspec import LLM, SamplingParams
from hyspec.structured import StructuredOutputsParams

METHODS = {"plain": None, "suffix": {"method": "suffix"}}


def processor_at(rev: str) -> type:
    """The GrammarProcessor class of core/structured/processor.py at git revision ``rev``."""
    root = Path(__file__).resolve().parents[4]
    source = subprocess.run(["git", "show", f"{rev}:core/structured/processor.py"], cwd=root, check=True,
                            capture_output=True, text=True).stdout
    module = types.ModuleType(f"hyspec.structured._processor_at_{rev}")
    exec(compile(source, f"{rev}:core/structured/processor.py", "exec"), module.__dict__)
    return module.GrammarProcessor


@contextlib.contextmanager
def grammar_processor_class(cls: type | None):
    """New requests get ``cls`` as their grammar processor (None: the current one)."""
    import hyspec.structured as structured

    current = structured.GrammarProcessor
    structured.GrammarProcessor = cls or current
    try:
        yield
    finally:
        structured.GrammarProcessor = current


def time_variant(llm: LLM, conversations: list, params: SamplingParams, processor: type | None) -> tuple:
    tokens, seconds, ids = 0, 0.0, []
    with grammar_processor_class(processor):
        for conversation in conversations:
            t0 = time.perf_counter()
            out = llm.chat(conversation, params)[0].outputs[0]
            seconds += time.perf_counter() - t0
            tokens += len(out.token_ids)
            ids.append(list(out.token_ids))
    return tokens, seconds, ids


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path(__file__).with_name("results.json"))
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--methods", nargs="+", choices=list(METHODS), default=list(METHODS))
    ap.add_argument("--baseline-rev", help="also time the grammar processor of this git revision")
    ap.add_argument("--kv-cache-mib", type=int, default=512,
                    help="KV cache (batch 1 needs little; 512 MiB holds one 8192-token sequence)")
    ap.add_argument("--note", default="shared with other jobs (timings noisy)", help="what the machine was doing")
    args = ap.parse_args()
    conversations = [[{"role": "user", "content": text}] for text in prompts(args.prompts)]
    free = SamplingParams(temperature=0, max_tokens=args.max_tokens)
    constrained = SamplingParams(temperature=0, max_tokens=args.max_tokens,
                                 structured_outputs=StructuredOutputsParams(json=SCHEMA))
    variants = {"unconstrained": (free, None), "json_schema": (constrained, None)}
    if args.baseline_rev:
        variants[f"json_schema@{args.baseline_rev}"] = (constrained, processor_at(args.baseline_rev))
    report: dict = {"what": "LLM.chat tokens/s with and without a JSON schema, interleaved in one process, "
                            "batch 1, T 0", "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
                    "prompts": args.prompts, "max_tokens": args.max_tokens,
                    "rounds": args.rounds, "note": args.note, "methods": {}}
    constrained_ids: dict[str, list] = {}
    for method in args.methods:
        llm = LLM(speculative_config=METHODS[method], kv_cache_bytes=args.kv_cache_mib << 20)
        try:
            for params, processor in variants.values():  # warm-up: grammar compile, kernels
                time_variant(llm, conversations[:1], params, processor)
            rates: dict[str, list[float]] = {name: [] for name in variants}
            for _ in range(args.rounds):
                for name, (params, processor) in variants.items():
                    tokens, seconds, ids = time_variant(llm, conversations, params, processor)
                    rates[name].append(tokens / seconds)
                    if params is constrained:
                        constrained_ids[f"{method}/{name}"] = ids
        finally:
            llm.close()
        medians = {name: round(statistics.median(r), 2) for name, r in rates.items()}
        report["methods"][method] = {
            "tokens_per_s_median": medians,
            "tokens_per_s_rounds": {name: [round(x, 2) for x in r] for name, r in rates.items()},
            "constrained_over_unconstrained": {name: round(medians[name] / medians["unconstrained"], 3)
                                               for name in variants if name != "unconstrained"},
        }
        print(method, json.dumps(report["methods"][method]), flush=True)
    reference = next(iter(constrained_ids.values()))
    report["constrained_tokens_identical"] = {name: ids == reference for name, ids in constrained_ids.items()}
    existing = json.loads(args.out.read_text()) if args.out.exists() else {}
    existing["grammar_overhead"] = report
    args.out.write_text(json.dumps(existing, indent=1) + "\n")
    if not all(report["constrained_tokens_identical"].values()):
        raise SystemExit(f"constrained tokens differ: {report['constrained_tokens_identical']}")


if __name__ == "__main__":
    sys.exit(main())
