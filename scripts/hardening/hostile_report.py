"""The hostile part of the hardening run (scripts/hardening/run.py): one server per table, its rows
summarized, compacted for the JSON and rendered as the Markdown table."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
from hostile_cases import all_cases, run_case, short
from serve_process import Server


def hostile_table(out: Path, suffix: str, api_key: str | None) -> dict[str, Any]:
    label = "api-key" if api_key else "no-key"
    server = Server(out / f"logs{suffix}" / f"hostile-{label}.log", api_key=api_key)
    result: dict[str, Any] = {"server": "hyspec serve (default model)" + (" with --api-key" if api_key else "")}
    try:
        result["startup_s"] = round(server.wait_ready(), 1)
        model = httpx.get(server.url + "/v1/models", headers=server.auth, timeout=10).json()["data"][0]["id"]
        result["rss_mib_start"] = server.rss_mib()
        cases = all_cases(model, api_key)
        rows = []
        for i, case in enumerate(cases):
            row = run_case(server, case)
            rows.append(row)
            if server.proc.poll() is not None:
                rows.append({"name": "(server exited)", "status": None, "message": f"exit {server.proc.returncode}"})
                break
            print(f"  [{label} {i + 1}/{len(cases)}] {row['status']} {case.name} ({row['seconds']} s)", flush=True)
        result["rows"] = rows
        result["rss_mib_end"] = server.rss_mib()
        result["after"] = server.wait_idle(120)
    finally:
        result["exit_status"] = server.stop()
        result.update(server.finish_log())
    result["summary"] = summarize(result["rows"])
    return result


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    statuses: dict[str, int] = {}
    for r in rows:
        statuses[str(r["status"])] = statuses.get(str(r["status"]), 0) + 1
    return {"rows": len(rows), "by_status": dict(sorted(statuses.items())),
            "5xx": [r["name"] for r in rows if isinstance(r["status"], int) and r["status"] >= 500],
            "no_response": [r["name"] for r in rows if r["status"] is None],
            "400_without_field": [r["name"] for r in rows if r.get("names_field") is False]}


def compact_row(row: dict[str, Any]) -> dict[str, Any]:
    """A row as saved: no empty keys, short bodies of successes, content types only where not JSON; what was
    sent is in the .md table (it is the same for every run of this script)."""
    if row.get("as_in_first_table"):
        return row
    out = {k: v for k, v in row.items() if v is not None and k not in ("content_type", "field", "sent", "names_field")}
    out["status"] = row.get("status")  # None: no answer at all
    if row.get("names_field") is False:
        out["names_field"] = False
    if row.get("field") and row.get("status") == 400:
        out["field"] = row["field"]
    ctype = row.get("content_type") or ""
    if ctype and "json" not in ctype:
        out["content_type"] = ctype
    if isinstance(row.get("message"), str):
        out["message"] = short(row["message"], 40 if (row.get("status") or 0) < 300 else 160)
    return out


def compact_results(results: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The tables are the same cases in the same order: rows of the later tables with the first table's
    outcome (_same_outcome) say only that."""
    compacted: dict[str, dict[str, Any]] = {}
    first: dict[str, dict[str, Any]] = {}
    for label, result in results.items():
        rows = [compact_row(r) for r in result["rows"]]
        if first:
            rows = [{"name": r["name"], "status": r["status"], "as_in_first_table": True,
                     **{k: r[k] for k in ("health_during", "prompt_tokens", "root") if k in r},
                     **({"seconds": r["seconds"]} if (r.get("seconds") or 0) >= 1 else {})}
                    if _same_outcome(r, first.get(r["name"], {})) else r for r in rows]
        else:
            first = {r["name"]: r for r in rows}
        compacted[label] = {**result, "rows": rows}
    return compacted


def _same_outcome(row: dict[str, Any], other: dict[str, Any]) -> bool:
    """Same status, and for errors the same message (successful bodies differ in ids and timestamps)."""
    if row.get("status") != other.get("status"):
        return False
    return (row.get("status") or 0) < 300 or row.get("message") == other.get("message")


def hostile_markdown(results: dict[str, dict[str, Any]], sent: dict[str, str]) -> str:
    """The first table in full; the others only where a row's status or message differs from the first's."""
    lines: list[str] = []
    first: dict[str, dict[str, Any]] = {}
    for label, result in results.items():
        s = result["summary"]
        lines += [f"## {label}: {result['server']}", "",
                  (f"{s['rows']} rows; by status {s['by_status']}; **5xx: {len(s['5xx'])}** {s['5xx'] or ''}; "
                   f"no response: {s['no_response'] or 'none'}; 400s not naming their field: "
                   f"{s['400_without_field'] or 'none'}; tracebacks in the log: {result['traceback_lines']}; "
                   f"KV pool empty after: {result['after'].get('kv_pool_empty')}; exit status {result['exit_status']}"),
                  ""]
        rows = result["rows"]
        if first:
            same = [r for r in rows if r.get("as_in_first_table")]
            rows = [r for r in rows if r not in same]
            lines += [f"{len(same)} rows as in the first table (same status; for errors the same message); the others:",
                      ""]
        lines += ["| # | case | sent | status | message / body | s |", "|---|---|---|---|---|---|"]
        for i, r in enumerate(rows, 1):
            extra = ""
            if "prompt_tokens" in r:
                extra = f" [prompt_tokens {r['prompt_tokens']}]"
            if "root" in r:
                extra = f" [root: {r['root']}]"
            if "health_during" in r:
                extra = f" [/health max {r['health_during']['max_s']} s over {r['health_during']['probes']} probes]"
            if "retry_after" in r:
                extra += f" [Retry-After {r['retry_after']}]"
            if r.get("names_field") is False:
                extra += " **(field not named)**"
            message = short(r.get("message") or "", 40 if (r.get("status") or 0) < 300 else 120)
            cells = [str(i), r["name"], short(sent.get(r["name"], ""), 70), str(r.get("status")), message + extra,
                     str(r.get("seconds", ""))]
            lines.append("| " + " | ".join(_md_cell(c) for c in cells) + " |")
        lines.append("")
        if not first:
            first = {r["name"]: r for r in result["rows"]}
    return "\n".join(lines)


def _md_cell(text: str) -> str:
    text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    text = text.encode("unicode_escape").decode("ascii") if any(ord(ch) < 32 for ch in text) else text
    return short(text, 200).replace("|", "\\|").replace("\n", " ")
