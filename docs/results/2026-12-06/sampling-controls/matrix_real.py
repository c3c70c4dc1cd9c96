"""Method x control at temperature 0 on the default model with the trained drafters.  Writes matrix-real.json.

    TORCH_DEVICE_BACKEND_AUTOLOAD=0 .venv/bin/python docs/results/2026-12-06/sampling-controls/matrix_real.py \
        [--methods ngram suffix ...] [--max-tokens 40] [--out matrix-real.json]

SmolLM2-135M-Instruct from its GGUF (LLM()'s default), the drafters of assets/ (a speculative_config
without "model"), 2 HumanEval heads + 2 chat questions; the controls of hyspec.conformance.controls plus
a JSON schema (SamplingParams.structured_outputs).  hyspec.conformance.real_controls does the work; the
slow test tests/spec/test_controls_identity_real.py runs the same function.  The JSON is rewritten after
every method, so a run cut short keeps what it finished.  ``--merge A.json B.json ...`` joins runs over
disjoint method sets (each with its own plain reference, which must agree) into --out.
"""
from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

from hyspec.conformance.real_controls import REAL_CONTROLS, REAL_METHODS, real_control_matrix


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--methods", nargs="*", default=list(REAL_METHODS))
    ap.add_argument("--controls", nargs="*", default=list(REAL_CONTROLS))
    ap.add_argument("--max-tokens", type=int, default=40)
    ap.add_argument("--out", default=str(Path(__file__).with_name("matrix-real.json")))
    ap.add_argument("--merge", nargs="*", default=None, help="join these runs' JSONs into --out instead of running")
    args = ap.parse_args()
    if args.merge:
        merge([json.loads(Path(f).read_text()) for f in args.merge], Path(args.out))
        return
    started = time.time()
    head = {"what": "greedy identity with sampling controls and a JSON schema, method x control "
                    "(SmolLM2-135M-Instruct GGUF, the trained drafters of assets/)",
            "machine": f"{platform.node()} ({platform.processor() or platform.machine()}), CPU, shared with other "
                       "jobs: seconds are not measurements",
            "command": "TORCH_DEVICE_BACKEND_AUTOLOAD=0 .venv/bin/python "
                       "docs/results/2026-12-06/sampling-controls/matrix_real.py"}

    def write(result: dict) -> None:
        out = {**head, "seconds": round(time.time() - started, 1), "table": table(result["rows"]), **result}
        Path(args.out).write_text(json.dumps(out, indent=1) + "\n")

    result = real_control_matrix(tuple(args.methods), tuple(args.controls), args.max_tokens, on_method=write)
    write(result)
    for r in result["rows"]:
        print(f"{r['method']:12s} {r['control']:20s} identical={r['identical']} "
              f"accepted={r.get('accepted_tokens')}/{r.get('draft_tokens')} {r.get('error', '')}")
    print("all identical:", result["all_identical"])


def table(rows: list[dict]) -> dict[str, dict[str, str]]:
    """method -> control -> "yes (accepted drafts)" / "NO (...)" / "error"."""
    out: dict[str, dict[str, str]] = {}
    for r in rows:
        cell = "yes" if r["identical"] else ("NO" if r["identical"] is False else "error")
        out.setdefault(r["method"], {})[r["control"]] = f"{cell} ({r.get('accepted_tokens', 0)} acc)"
    return out


def merge(parts: list[dict], out_path: Path) -> None:
    """One JSON from runs over disjoint methods; their plain references must be the same tokens."""
    first = parts[0]
    for part in parts[1:]:
        if part["plain"]["texts"] != first["plain"]["texts"] or part["max_tokens"] != first["max_tokens"]:
            raise SystemExit("the runs' plain references differ: they cannot be joined")
    rows = [r for part in parts for r in part["rows"]]
    order = {m: i for i, m in enumerate(REAL_METHODS)}
    rows.sort(key=lambda r: order.get(r["method"], len(order)))
    methods = {m: part["methods"][m] for part in parts for m in part["methods"]}
    merged = {**first, "seconds": [part["seconds"] for part in parts],
              "runs": [{"methods": list(part["methods"]), "seconds": part["seconds"]} for part in parts],
              "table": table(rows), "methods": dict(sorted(methods.items(), key=lambda kv: order.get(kv[0], 99))),
              "rows": rows, "all_identical": all(r.get("identical") is True for r in rows)}
    merged["command"] += " --methods <a third of them> (three runs side by side), then --merge the three JSONs"
    out_path.write_text(json.dumps(merged, indent=1) + "\n")
    print("all identical:", merged["all_identical"])


if __name__ == "__main__":
    main()
