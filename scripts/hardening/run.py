"""Issue 50 ("Hardening"): `hyspec serve` under hostile inputs, disconnecting clients and SIGTERM.

Starts the real `hyspec serve` (the default model, SmolLM2-135M-Instruct) on 127.0.0.1 as a subprocess,
several times, and writes to docs/results/2026-12-06/hardening/ (``--out``; SUFFIX is ``--suffix``, e.g.
``-before``) one document, ``runs{SUFFIX}.json`` (a run of some parts, ``--only``, replaces those parts' entries and keeps the others):

- ``hostile`` (and ``hostile{SUFFIX}.md``): about 200 hostile requests, once without and once with
  ``--api-key``; each row is what was sent, the status and the error message (or the body's first 120 characters).
- ``load``: 32 concurrent streaming clients (a third leave mid-stream) plus non-streamed
  requests whose clients leave; statuses, server RSS before/after, KV pool after, tracebacks in the log.
- ``sigterm``: SIGTERM with 8 requests in flight (they finish within --shutdown-timeout, then
  they outlive it), new requests during the drain, how each response ended, the exit status.
- ``summary``: the figures of the three parts that the README's table quotes.
- ``logs{SUFFIX}/*.log``: the servers' logs (head and tail only; tracebacks are counted before cutting).

    .venv/bin/python scripts/hardening/run.py --suffix=-before

Every loop is bounded in count and time; all traffic goes to 127.0.0.1.  The parts live beside this file:
serve_process.py (the server subprocess), hostile_cases.py (the requests), hostile_report.py (their tables),
load_and_sigterm.py (the clients and the signal).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from hostile_cases import API_KEY, all_cases, describe
from hostile_report import compact_results, hostile_markdown, hostile_table
from load_and_sigterm import load_run, sigterm_run
from serve_process import REPO, RESULTS


def git_commit() -> str:
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=False).stdout.strip()

    dirty = git("status", "--porcelain", "core/")
    return git("rev-parse", "HEAD") + (" (core/ has uncommitted changes)" if dirty else "")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--suffix", default="", help="appended to every output name, e.g. -before")
    parser.add_argument("--out", type=Path, default=RESULTS, help="output folder (default: docs/results/2026-12-06/hardening)")
    parser.add_argument("--note", default="", help="recorded with the results (e.g. which tree the server ran from)")
    parser.add_argument("--render-only", action="store_true",
                        help="with --only hostile: rewrite runs{SUFFIX}.json's hostile part and hostile{SUFFIX}.md "
                             "from the saved rows, run nothing")
    parser.add_argument("--only", choices=("hostile", "load", "sigterm"), action="append",
                        help="run only these parts (default: all)")
    args = parser.parse_args(argv)
    parts = args.only or ["hostile", "load", "sigterm"]
    out, suffix = args.out, args.suffix
    meta = {"commit": git_commit(), "hyspec_imported_from": hyspec_location(), "note": args.note,
            "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "machine": f"{os.cpu_count()} CPUs, {platform_line()}, load average at start {os.getloadavg()[0]:.1f}"}
    t0 = time.monotonic()
    summary: dict[str, Any] = {"meta": meta}
    doc_path = out / f"runs{suffix}.json"
    doc: dict[str, Any] = json.loads(doc_path.read_text()) if doc_path.exists() else {}
    if "hostile" in parts:
        if args.render_only:  # rewrite the .json and .md of an earlier run (e.g. after changing their layout)
            saved = dict(doc["hostile"])
            meta = saved.pop("meta")
            results = saved
            model = next(r["name"] for r in next(iter(results.values()))["rows"]
                         if r["name"].startswith("GET /v1/models/") and r["name"].endswith(" no key"))
            model = model.removeprefix("GET /v1/models/").removesuffix(" no key")
            for row, case in zip(next(iter(results.values()))["rows"], all_cases(model, API_KEY)):
                row.setdefault("sent", describe(case))
        else:
            results = {"without --api-key": hostile_table(out, suffix, None),
                       "with --api-key": hostile_table(out, suffix, API_KEY)}
        sent = {r["name"]: r.get("sent", "") for r in next(iter(results.values()))["rows"]}
        results = compact_results(results)
        doc["hostile"] = {"meta": meta, **results}
        (out / f"hostile{suffix}.md").write_text(
            f"# Hostile inputs: hyspec imported from {meta['hyspec_imported_from']}, {meta['commit']}\n\n"
            f"{meta['note']}\n\n" + hostile_markdown(results, sent))
        summary["hostile"] = {k: {**v["summary"], "tracebacks": v["traceback_lines"], "exit_status": v["exit_status"],
                                  "kv_pool_empty_after": v["after"].get("kv_pool_empty"),
                                  "rss_mib": [v.get("rss_mib_start"), v.get("rss_mib_end")]}
                              for k, v in results.items()}
    if "load" in parts:
        load = load_run(out, suffix)
        doc["load"] = {"meta": meta, **load}
        summary["load"] = {k: load.get(k) for k in ("statuses", "5xx", "streams_completed", "streams_meant_to_complete",
                                                    "streams_left", "error_events", "rss_mib_before", "rss_mib_after",
                                                    "traceback_lines", "exit_status", "seconds")}
        summary["load"]["kv_pool_empty_after"] = load.get("after", {}).get("kv_pool_empty")
    if "sigterm" in parts:
        # On the busy 2-core box (4 other agents' jobs) 8 requests made 3-10 tokens/s together: 8 x 2 tokens fit a
        # 20 s drain, 8 x 4000 do not fit a 3 s one.
        runs = [sigterm_run(out, suffix, "finish-in-time", max_tokens=2, shutdown_timeout=20.0),
                sigterm_run(out, suffix, "outlive-timeout", max_tokens=4000, shutdown_timeout=3.0)]
        doc["sigterm"] = {"meta": meta, "runs": runs}
        summary["sigterm"] = [{k: r.get(k) for k in ("run", "5xx", "in_flight_statuses", "requests_finished",
                                                     "health_after_signal",
                                                     "streams_done", "streams_error_event",
                                                     "late_503_with_retry_after", "late_refused",
                                                     "traceback_lines", "exit_status", "exit_s_after_signal")}
                              for r in runs]
    if args.render_only:
        write_json(doc_path, doc)
        return 0
    meta["seconds"] = round(time.monotonic() - t0, 1)
    if args.only and "summary" in doc:  # a partial run updates the parts it ran
        summary = {**doc["summary"], **summary}
    doc["summary"] = summary
    write_json(doc_path, doc)
    print(json.dumps(summary, indent=1))
    return 0


def hyspec_location() -> str:
    """Where the servers import hyspec from (this checkout, or a tree named by PYTHONPATH for a baseline)."""
    code = "import hyspec, os; print(os.path.dirname(hyspec.__file__))"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                          check=False).stdout.strip()


def platform_line() -> str:
    try:
        model = re.search(r"^model name\s*:\s*(.+)$", Path("/proc/cpuinfo").read_text(), re.MULTILINE)
        return model.group(1).strip() if model else "unknown CPU"
    except OSError:
        return "unknown CPU"


def write_json(path: Path, data: Any) -> None:
    """Indented, except that each row of a table (a dict inside a list) takes one line."""
    rows: list[str] = []

    def stash(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: stash(v) for k, v in value.items()}
        if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            rows.append(",\n  ".join(json.dumps(v, ensure_ascii=True, default=str, separators=(",", ":"))
                                      for v in value))
            return f"@@rows{len(rows) - 1}@@"
        return value

    text = json.dumps(stash(data), indent=1, ensure_ascii=True, default=str)
    text = re.sub(r'"@@rows(\d+)@@"', lambda m: "[\n  " + rows[int(m.group(1))] + "\n ]", text)
    path.write_text(text + "\n")


if __name__ == "__main__":
    sys.exit(main())
