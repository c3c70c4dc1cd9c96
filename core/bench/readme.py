"""The README's benchmark section, rendered from a saved result (``hyspec bench --readme-table RESULT.json``)."""
from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

from hyspec.bench.result import OK, SCHEMA_VERSION
from hyspec.errors import HyspecError

IDENTITY = {"identical": "yes", "near_tie": "yes (near-tie)", "mismatch": "**NO: mismatch**",
            "not_applicable": "n/a (sampled)"}


def load_result(path: Path) -> dict[str, Any]:
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise HyspecError(f"--readme-table {path}: cannot read a bench result: {exc}") from None
    if not isinstance(doc, dict) or doc.get("kind") != "hyspec-bench":
        raise HyspecError(f"--readme-table {path}: not a hyspec bench result (no \"kind\": \"hyspec-bench\")")
    if doc.get("schema_version") != SCHEMA_VERSION:
        raise HyspecError(f"--readme-table {path}: schema version {doc.get('schema_version')!r}; this hyspec "
                          f"reads version {SCHEMA_VERSION}")
    return doc


def _x(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}×"


def _identity(row: dict[str, Any]) -> str:
    if row["engine"] == "vllm" and row.get("identity"):  # vLLM's speculative rows: against vLLM plain
        return IDENTITY[row["identity"]["status"]] + " (vs vLLM plain)"
    if row["engine"] != "hyspec":
        return "–"
    if row["method"] == "none":
        return "reference"
    ident = row.get("identity")
    return "–" if ident is None else IDENTITY[ident["status"]]


def _vllm_sentence(info: dict[str, Any] | None) -> str:
    if not info:
        return "; vLLM in worker processes of its own venv"
    return (f"; vLLM {info.get('version')} (CPU build) in worker processes of its own venv, one engine at a time "
            f"after hyspec's rows, on `{Path(info['model']).name}` in {info.get('dtype')} (a Hugging Face "
            "directory), the same prompt token ids and token count")


def render_readme_section(doc: dict[str, Any], heading: str = "## Benchmark") -> str:
    """Markdown: how it was measured, on which machine, the table, the goals and the bandwidth limit."""
    s, model, data = doc["settings"], doc["model"], doc["dataset"]
    command = shlex.join(doc["command"]) if doc.get("command") else "hyspec bench"
    vllm = any(r["engine"] == "vllm" for r in doc["results"])
    out = [heading, "",
           f"Measured with `{command}` on **{doc['machine_label']}** ({doc['created_utc'][:10]}, hyspec "
           f"{doc['hyspec_version']}). Target: `{model['name']}` ({model['parameters'] / 1e6:.1f}M parameters, "
           f"{model['dtype']}" + (f"; {model['quantization']['summary']}" if model.get("quantization") else "")
           + f"); {data['num_prompts']} {data['name']} prompts, {s['max_tokens']} generated tokens "
           f"per request (EOS ignored on every side), tokens/s is the median of {s['repeats']} runs "
           f"(min–max). The transformers peers ran in the same process on the same weights and prompts"
           + ("; llama.cpp (llama-cpp-python) in a child process on the same GGUF, prompt token ids, token "
              "count and thread count" if any(p.startswith("llamacpp") for p in s.get("peers", ())) else "")
           + (_vllm_sentence(model.get("vllm")) if vllm else "")
           + ".", "",
           "| configuration | batch | T | tokens/s | × hyspec plain | × transformers generate | × llama.cpp "
           + ("| × vLLM " if vllm else "")
           + "| mean acceptance length | TTFT (ms) | peak RSS (MiB) | token-identical |",
           "|---|---:|---:|---:|---:|---:|---:|" + ("---:|" if vllm else "") + "---:|---:|---:|---|"]
    notes: list[str] = []
    for r in doc["results"]:
        if r["status"] != OK:
            if r["reason"] not in notes:
                notes.append(r["reason"])
            out.append(f"| {r['label']} | {r['batch_size']} | {r['temperature']:g} | {r['status']} "
                       f"[^{notes.index(r['reason']) + 1}] | | | | | | | |" + (" |" if vllm else ""))
            continue
        t = r["tokens_per_s"]
        acc = (r.get("acceptance") or {}).get("mean_acceptance_length")
        ttft = None if r["ttft_s"] is None else r["ttft_s"]["median"] * 1e3
        out.append(f"| {r['label']} | {r['batch_size']} | {r['temperature']:g} | {t['median']:.1f} "
                   f"({t['min']:.1f}–{t['max']:.1f}) | {_x(r['speedup_vs_plain'])} "
                   f"| {_x(r['speedup_vs_peers'].get('hf_generate'))} "
                   f"| {_x(r['speedup_vs_peers'].get('llamacpp'))} "
                   + (f"| {_x(r['speedup_vs_peers'].get('vllm'))} " if vllm else "")
                   + f"| {'–' if acc is None else f'{acc:.2f}'} "
                   f"| {'–' if ttft is None else f'{ttft:.1f}'} | {r['peak_rss_bytes'] / 2**20:.0f} "
                   f"| {_identity(r)} |")
    prefill = doc.get("prefill")
    if prefill:
        parts = [f"{e['label']} {e['tokens_per_s']['median']:.0f} ({e['tokens_per_s']['min']:.0f}–"
                 f"{e['tokens_per_s']['max']:.0f})" if "tokens_per_s" in e else f"{e['label']}: {e['error']}"
                 for e in prefill["engines"]]
        out += ["", f"Prefill of one {prefill['prompt_tokens']}-token prompt, prompt tokens/s (median of "
                    f"{prefill['repeats']}, min–max): " + "; ".join(parts) + "."]
    bw = doc["bandwidth"]
    out += ["", f"Memory-bandwidth limit of plain decoding: {bw['copy']['bytes_per_s'] / 1e9:.2f} GB/s copy "
                f"bandwidth ÷ {bw['decode_weight_bytes'] / 2**20:.1f} MiB of weights per step = "
                f"{bw['plain_limit_tokens_per_s_bs1']:.1f} tokens/s at batch size 1.", "",
            "| goal | measured | target | met |", "|---|---:|---:|---|"]
    for g in doc["goals"]:
        met = {True: "yes", False: "**no**"}.get(g["met"], "incomplete" if g["measured"] is not None
                                                  else "not measured")
        measured = "–" if g["measured"] is None else f"{g['measured']:.3g}"
        out.append(f"| {g['goal']} ({g['detail']}) | {measured} | {g['target']} | {met} |")
    ident = doc["identity"]
    out += ["", f"Token identity at temperature 0: {ident['checked']} configurations checked, "
                + ("**mismatches found**." if ident["mismatches"] else
                   "none ran." if not ident["checked"] else
                   "all identical to plain decoding." if ident["all_identical"] else
                   "identical up to allowed near-ties.")]
    if notes:
        out.append("")
        out += [f"[^{i}]: {note}" for i, note in enumerate(notes, 1)]
    return "\n".join(out) + "\n"
