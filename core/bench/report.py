"""The terminal table of a benchmark result (a live run or a saved JSON render the same).

A token mismatch is never hidden: its row is printed in red (on a terminal)
with MISMATCH in the identity column, and the divergence details follow the
table under a banner.
"""
from __future__ import annotations

from typing import Any

from hyspec.bench.ceiling import is_ceiling
from hyspec.bench.result import OK, SKIPPED

RED, BOLD, RESET = "\033[31;1m", "\033[1m", "\033[0m"
PEER_SHORT = {"hf_generate": "×HF gen", "hf_prompt_lookup": "×HF lookup", "hf_assisted": "×HF assist",
              "llamacpp": "×llama.cpp", "llamacpp_prompt_lookup": "×lcpp lookup", "vllm": "×vLLM"}
IDENTITY_TEXT = {"identical": "yes", "near_tie": "near-tie", "mismatch": "MISMATCH", "not_applicable": "n/a (T>0)"}


def _num(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def _mib(value: int | None) -> str:
    return "-" if value is None else f"{value / 2**20:.0f}"


def _rate(row: dict[str, Any]) -> str:
    t = row["tokens_per_s"]
    return f"{t['median']:.1f} ({t['min']:.1f}-{t['max']:.1f})"


def _identity(row: dict[str, Any]) -> str:
    if row["engine"] == "vllm" and row.get("identity"):  # vLLM's speculative rows: against vLLM plain
        return {"identical": "= vLLM plain", "mismatch": "≠ vLLM plain"}.get(row["identity"]["status"], "-")
    if row["engine"] != "hyspec":
        agreement = row.get("agreement_with_hyspec_plain")
        return "-" if agreement is None else {"identical": "same", "near_tie": "near-tie",
                                              "mismatch": "differs (info)"}.get(agreement["status"], "-")
    if row["method"] == "none":
        return "reference" if row["temperature"] == 0 else "n/a (T>0)"
    ident = row.get("identity")
    return "-" if ident is None else IDENTITY_TEXT[ident["status"]]


def _header(doc: dict[str, Any]) -> list[str]:
    model, data, bw = doc["model"], doc["dataset"], doc["bandwidth"]
    s = doc["settings"]
    pt = data["prompt_tokens"]
    return [
        f"{BOLD}hyspec bench{RESET}: {doc['machine_label']}",
        f"model {model['name']} ({model['parameters'] / 1e6:.1f}M parameters, {model['dtype']}, "
        + (f"{model['quantization']['summary']}, " if model.get("quantization") else "") +
        f"{model['decode_weight_bytes'] / 2**20:.1f} MiB read per decode step)",
        f"prompts {data['name']}: {data['num_prompts']} (mean {pt['mean']:.0f} tokens"
        + (f", {data['truncated']} left-truncated" if data["truncated"] else "") + f"); {s['max_tokens']} tokens "
        f"per request (EOS ignored); median of {s['repeats']} runs (min-max)"
        + {True: "; hyspec: prefix caching on (emptied before each pass)", False: "; hyspec: prefix caching off"}
        .get(s.get("prefix_caching"), "")
        + ("; hyspec: continuous batching (batch size = requests in flight, refilled as each finishes)"
           if s.get("batching") == "continuous" else ""),
        f"copy bandwidth {bw['copy']['bytes_per_s'] / 1e9:.2f} GB/s -> plain-decoding limit "
        f"{bw['plain_limit_tokens_per_s_bs1']:.1f} tok/s at batch size 1 (x batch size above)",
    ]


def format_table(doc: dict[str, Any], color: bool = False) -> str:
    """The human-readable report of a result document."""
    red, bold, reset = (RED, BOLD, RESET) if color else ("", "", "")
    lines = [line.replace(BOLD, bold).replace(RESET, reset) for line in _header(doc)]
    priced = doc["settings"].get("price_per_hour") is not None
    asked = set(doc["settings"].get("peers", PEER_SHORT))  # --peers none (and --demo): no peer columns
    shown = [p for p in PEER_SHORT if p in asked]  # a column per peer that was asked for
    columns = ["configuration", "bs", "T", "tok/s (min-max)", "×plain", *(PEER_SHORT[p] for p in shown), "acc.len",
               "TTFT ms", "peak MiB", "of BW limit", *(["$/Mtok"] if priced else []), "identical"]
    table, notes, colors = [], [], []
    for r in doc["results"]:
        base = [r["label"], str(r["batch_size"]), f"{r['temperature']:g}"]
        if r["status"] != OK:
            if r["reason"] not in notes:
                notes.append(r["reason"])
            table.append(base + [f"{r['status']} [{notes.index(r['reason']) + 1}]"])
            colors.append(red if r["engine"] == "hyspec" and r["status"] != SKIPPED else "")
            continue
        acc = r.get("acceptance") or {}
        cells = base + [_rate(r), _num(r["speedup_vs_plain"], ".2f")]
        cells += [_num(r["speedup_vs_peers"].get(p), ".2f") for p in shown]
        cells += [_num(acc.get("mean_acceptance_length"), ".2f"),
                  _num(None if r["ttft_s"] is None else r["ttft_s"]["median"] * 1e3, ".1f"),
                  _mib(r["peak_rss_bytes"]), _num(r["bandwidth_ratio"], ".0%")]
        if priced:
            cells.append(_num(r["cost_per_million_tokens"], ".3f"))
        cells.append(_identity(r))
        table.append(cells)
        mismatch = (r.get("identity") or {}).get("status") == "mismatch"
        colors.append(red if mismatch else "")
    widths = [max([len(name)] + [len(cells[i]) for cells in table if i < len(cells) and
                                 (len(cells) == len(columns) or i < 3)]) for i, name in enumerate(columns)]
    lines += ["", _render(columns, widths), "  ".join("-" * w for w in widths)]
    for cells, c in zip(table, colors):
        text = _render(cells, widths)
        lines.append(f"{c}{text}{reset}" if c else text)
    for i, note in enumerate(notes, 1):
        lines.append(f"[{i}] {note}")
    if any(is_ceiling(r["method"]) for r in doc["results"]):
        lines.append("ceiling_kK: an oracle drafting K tokens of plain decoding's own answer every step (always "
                     "accepted, free to draft): the most any method reaches with K drafts on this machine")
    lines += _acceptance_lines(doc)
    prefill = doc.get("prefill")
    if prefill:
        lines.append(f"prefill of one {prefill['prompt_tokens']}-token prompt, prompt tok/s: " + "; ".join(
            f"{e['label']} {_rate(e)}" if "tokens_per_s" in e else f"{e['label']}: {e['error']}"
            for e in prefill["engines"]))
    demo = doc["settings"].get("demo")
    if not demo:  # the goals are the full comparison's: the demo runs one method and no peers
        lines += _goal_lines(doc)
    lines += _identity_lines(doc, red, reset)
    if demo:
        lines += ["", ("tok/s: generated tokens over wall time, prefill included. The full comparison (every "
                       "method with a drafter, transformers beside it, the goals): hyspec bench --quick")]
    return "\n".join(lines) + "\n"


def _render(cells: list[str], widths: list[int]) -> str:
    """Label left-aligned, numbers right-aligned; a skipped/failed row's status runs across the rest."""
    if len(cells) < len(widths):
        return "  ".join([cells[0].ljust(widths[0]), cells[1].rjust(widths[1]), cells[2].rjust(widths[2]),
                          *cells[3:]])
    return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))


def _acceptance_lines(doc: dict[str, Any]) -> list[str]:
    out = []
    for r in doc["results"]:
        acc = r.get("acceptance") if r["status"] == OK else None
        if acc and acc.get("per_position"):
            rates = " ".join(f"{p:.2f}" for p in acc["per_position"])
            out.append(f"  {r['label']} bs {r['batch_size']} T {r['temperature']:g}: {rates} "
                       f"({acc['drafts']} drafts)")
    return ["", "acceptance by draft position (drafts accepted there / drafts):", *out] if out else []


def _goal_lines(doc: dict[str, Any]) -> list[str]:
    out = ["", "goals (temperature 0):"]
    for g in doc["goals"]:
        verdict = {True: "met", False: "MISSED"}.get(g["met"], "incomplete" if g["measured"] is not None
                                                      else "not measured")
        measured = "-" if g["measured"] is None else f"{g['measured']:.3g}"
        out.append(f"  {verdict:>12}  {g['goal']}: {measured} (target {g['target']}; {g['detail']})")
    return out


def _identity_lines(doc: dict[str, Any], red: str, reset: str) -> list[str]:
    ident = doc["identity"]
    out = [""]
    if ident["mismatches"]:
        out.append(f"{red}!! TOKEN MISMATCH: speculative output differs from plain decoding "
                   f"(not a near-tie){reset}")
        for m in ident["mismatches"]:
            out.append(f"{red}   {m['method']} bs {m['batch_size']} T {m['temperature']:g}: "
                       f"{'; '.join(m['details'])}{reset}")
    for m in ident["near_ties"]:
        out.append(f"note: {m['method']} bs {m['batch_size']}: allowed near-tie divergence: {'; '.join(m['details'])}")
    if not ident["checked"]:
        out.append("token identity: no greedy (temperature 0) speculative configuration ran")
    elif not ident["mismatches"]:
        out.append(f"token identity at temperature 0: {ident['checked']} configurations checked, "
                   + ("all identical" if ident["all_identical"] else "identical up to allowed near-ties"))
    for failure in doc["failed"]:
        out.append(f"{red}!! FAILED: {failure}{reset}")
    return out
