"""Is hyspec's vllm-ascend plugin in force on this machine?  One JSON report (scripts/npu_first_contact.sh).

    python -m hyspec.vllm.ascend_check               # the plugin's check, then vllm-ascend's modules imported
    python -m hyspec.vllm.ascend_check --model DIR   # and vLLM's greedy tokens, plain and with hyspec's proposer

``state``: ``absent`` (no vllm_ascend: plain vLLM, nothing to patch), ``present`` (vllm-ascend has custom_class
itself), ``patched`` (the plugin added it, and the imported modules carry the patch), ``mismatch`` (a vllm-ascend
shaped otherwise than the record: the error says how), ``import failed`` / ``not patched``.  With ``--model``,
each engine runs in its own process and ``generation`` says how many prompts gave the same tokens and where the
first difference is.  Exit status 0 when nothing is wrong.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from typing import Any

from hyspec.vllm.ascend_plugin import (DISPATCH, FACTORY, PATCHED, RUNNER_CLASS, VllmAscendMismatch, check,
                                       installed_version, load_record, register, source_root)

HEALTHY = ("absent", "present", "patched")
PROMPTS = ["def fibonacci(n):\n    if n < 2:\n        return n\n    return", "1, 2, 3, 4, 5, 6, 7, 8,",
           "The quick brown fox jumps over the lazy dog. The quick brown fox", "Write a haiku about the sea."]
TOKENS_LINE = "hyspec-tokens: "
PROPOSER = {"method": "custom_class", "model": "hyspec.vllm.HyspecProposer", "num_speculative_tokens": 4}


def patch_report() -> dict[str, Any]:
    record = load_record()
    out: dict[str, Any] = {"record": f"vllm-ascend {record['tag']} @ {record['commit'][:12]}", "vllm_ascend": None}
    root = source_root()
    if root is None:
        return {**out, "state": "absent"}
    out.update(vllm_ascend=installed_version(), source=str(root / "vllm_ascend"))
    try:
        out["state"] = check(root)
    except VllmAscendMismatch as exc:
        return {**out, "state": "mismatch", "error": str(exc)}
    if out["state"] == "present":
        return out
    register()
    try:  # what vLLM's worker imports (torch_npu, CANN): the import hook patches it on the way in
        import vllm_ascend.spec_decode as factory_module
        import vllm_ascend.worker.model_runner_v1 as runner_module
    except Exception as exc:  # noqa: BLE001 - reported, not raised: the first contact goes on
        return {**out, "state": "import failed", "error": f"{type(exc).__name__}: {exc}"}
    patched = {f"vllm_ascend.spec_decode.{FACTORY}": factory_module.get_spec_decode_method,
               f"{runner_module.__name__}.{FACTORY}": getattr(runner_module, FACTORY),
               f"{RUNNER_CLASS}.{DISPATCH}": getattr(getattr(runner_module, RUNNER_CLASS), DISPATCH)}
    out["patched"] = {name: bool(getattr(function, PATCHED, False)) for name, function in patched.items()}
    out["state"] = "patched" if all(out["patched"].values()) else "not patched"
    return out


def generate(model: str, speculative: bool, max_tokens: int, engine_args: dict[str, Any]) -> list[list[int]]:
    """vLLM's greedy tokens for PROMPTS (run in a process of its own: one engine per process)."""
    from vllm import LLM, SamplingParams
    extra = {"speculative_config": PROPOSER} if speculative else {}
    llm = LLM(model=model, seed=0, **engine_args, **extra)
    outputs = llm.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=max_tokens))
    return [list(o.outputs[0].token_ids) for o in outputs]


def first_difference(a: list[int], b: list[int]) -> int | None:
    """The first position where two token lists differ (None: equal)."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def compare_generation(args: argparse.Namespace) -> dict[str, Any]:
    runs = {}
    for name in ("plain", "hyspec"):
        command = [sys.executable, "-m", "hyspec.vllm.ascend_check", "--model", args.model, "--engine", name,
                   "--max-tokens", str(args.max_tokens), "--engine-args", args.engine_args]
        run = subprocess.run(command, capture_output=True, text=True, check=False, timeout=args.timeout)
        if run.returncode != 0:
            return {"engine": name, "error": run.stderr[-4000:]}
        lines = [line for line in run.stdout.splitlines() if line.startswith(TOKENS_LINE)]  # vLLM logs to stdout too
        if not lines:
            return {"engine": name, "error": "no tokens printed", "stdout": run.stdout[-4000:]}
        runs[name] = json.loads(lines[-1][len(TOKENS_LINE):])
    firsts = [first_difference(p, h) for p, h in zip(runs["plain"], runs["hyspec"])]
    return {"prompts": len(PROMPTS), "equal": sum(f is None for f in firsts), "first_difference_at": firsts,
            "tokens": runs}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="a Hugging Face model directory vLLM can serve (hyspec export-hf makes one)")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--engine-args", default="{}", help='JSON keyword arguments for vllm.LLM, e.g. '
                        '\'{"max_model_len": 1024, "gpu_memory_utilization": 0.5}\'')
    parser.add_argument("--timeout", type=float, default=900, help="seconds per engine")
    parser.add_argument("--engine", choices=("plain", "hyspec"), help=argparse.SUPPRESS)  # one child run
    args = parser.parse_args(argv)
    if args.engine:
        tokens = generate(args.model, args.engine == "hyspec", args.max_tokens, json.loads(args.engine_args))
        print(TOKENS_LINE + json.dumps(tokens), flush=True)
        return 0
    report = patch_report()
    ok = report["state"] in HEALTHY
    if args.model and ok:
        report["generation"] = compare_generation(args)
        ok = report["generation"].get("equal") == len(PROMPTS)
    print(json.dumps(report, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
