"""Result rows and the JSON document of a run (schema: docs/bench.md).

A row is one configuration: engine (hyspec or transformers) x method x batch
size x temperature.  Derived figures (speed-ups, the bandwidth ratio, cost,
the goals of the benchmark issue) are computed here from the measured ones,
so a saved JSON and a live run render the same table.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable

from hyspec import __version__
from hyspec.bench.ceiling import is_ceiling
from hyspec.bench.identity import MISMATCH, NEAR_TIE, IdentityVerdict
from hyspec.bench.machine import machine_label
from hyspec.bench.measure import Measurement
from hyspec.bench.settings import ALL_PEERS, LLAMACPP_PEERS, PEER_LABELS, PLAIN, VLLM_PEERS
from hyspec.bench.stats import cost_per_million_tokens, ratio

SCHEMA_VERSION = 1
OK, SKIPPED, FAILED = "ok", "skipped", "failed"
HYSPEC, TRANSFORMERS, LLAMACPP, VLLM = "hyspec", "transformers", "llama.cpp", "vllm"


def peer_engine(peer: str) -> str:
    return LLAMACPP if peer in LLAMACPP_PEERS else VLLM if peer in VLLM_PEERS else TRANSFORMERS
GOAL_BATCH_SIZES = (1, 4, 16, 32)


@dataclass
class Row:
    engine: str  # hyspec | transformers | llama.cpp | vllm
    method: str  # a hyspec method ("none" = plain decoding) or a peer name
    batch_size: int
    temperature: float
    status: str  # ok | skipped | failed
    reason: str | None = None
    measurement: Measurement | None = None
    identity: IdentityVerdict | None = None  # hyspec rows: vs hyspec plain decoding; vLLM's: vs vLLM plain (T 0)
    agreement: IdentityVerdict | None = None  # peer rows: vs hyspec plain decoding, for information only

    def __post_init__(self) -> None:
        if self.status not in (OK, SKIPPED, FAILED):
            raise ValueError(f"Row.status must be ok, skipped or failed, got {self.status!r}")
        if (self.status == OK) != (self.measurement is not None):
            raise ValueError("Row: a measurement exactly when the status is ok")

    @property
    def label(self) -> str:
        if self.engine != HYSPEC:
            return PEER_LABELS.get(self.method, self.method)
        return "hyspec plain" if self.method == PLAIN else f"hyspec {self.method}"

    def to_dict(self) -> dict[str, Any]:
        m = self.measurement
        return {
            "engine": self.engine, "method": self.method, "label": self.label, "batch_size": self.batch_size,
            "temperature": self.temperature, "status": self.status, "reason": self.reason,
            "tokens_per_s": None if m is None else m.tokens_per_s.to_dict(),
            "generated_tokens": None if m is None else m.generated_tokens,
            "ttft_s": None if m is None or m.ttft_s is None else m.ttft_s.to_dict(),
            "peak_rss_bytes": None if m is None else m.peak.rss_bytes,
            "peak_device_bytes": None if m is None else m.peak.device_bytes,
            "acceptance": None if m is None else m.acceptance,
            "identity": None if self.identity is None else self.identity.to_dict(),
            "agreement_with_hyspec_plain": None if self.agreement is None else self.agreement.to_dict(),
        }


def _rate(row: dict[str, Any]) -> float | None:
    return row["tokens_per_s"]["median"] if row["status"] == OK else None


def _find(rows: list[dict[str, Any]], engine: str, method: str, bs: int, temp: float) -> dict[str, Any] | None:
    for r in rows:
        if (r["engine"], r["method"], r["batch_size"], r["temperature"]) == (engine, method, bs, temp):
            return r
    return None


def derive(rows: list[dict[str, Any]], decode_weight_bytes: int | None, copy_bytes_per_s: float | None,
           price_per_hour: float | None) -> None:
    """Add speed-ups, the bandwidth limit and ratio, and the cost per million tokens to every row (in place)."""
    for r in rows:
        bs, temp, rate = r["batch_size"], r["temperature"], _rate(r)
        plain = _find(rows, HYSPEC, PLAIN, bs, temp)
        r["speedup_vs_plain"] = ratio(rate, _rate(plain) if plain else None)
        r["speedup_vs_peers"] = {}
        for peer in ALL_PEERS:
            other = _find(rows, peer_engine(peer), peer, bs, temp)
            r["speedup_vs_peers"][peer] = ratio(rate, _rate(other) if other else None)
        limit = (bs * copy_bytes_per_s / decode_weight_bytes
                 if decode_weight_bytes and copy_bytes_per_s else None)
        r["bandwidth_limit_tokens_per_s"] = limit
        r["bandwidth_ratio"] = ratio(rate, limit)
        r["cost_per_million_tokens"] = cost_per_million_tokens(rate, price_per_hour)


def _goal(goal: str, target: float, measured: float | None, detail: str, complete: bool = True) -> dict[str, Any]:
    met = None if measured is None or not complete else measured >= target
    return {"goal": goal, "target": target, "measured": measured, "met": met, "detail": detail}


def _described(row: dict[str, Any] | None, name: str) -> str:
    rate = _rate(row) if row else None
    return f"{name} not measured" if rate is None else f"{name} {rate:.1f} tok/s"


def goals(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The benchmark issue's goals as measured ratios at temperature 0 (met: None when not fully measured)."""
    t0 = 0.0
    plain1 = _find(rows, HYSPEC, PLAIN, 1, t0)
    hf1 = _find(rows, TRANSFORMERS, "hf_generate", 1, t0)
    plain_rate = _rate(plain1) if plain1 else None
    out = [_goal("hyspec plain decoding >= 1.3x transformers generate (batch 1)", 1.3,
                 ratio(plain_rate, _rate(hf1) if hf1 else None),
                 f"{_described(plain1, 'hyspec plain')} vs {_described(hf1, 'transformers generate')}")]
    batch1 = [r for r in rows if r["engine"] == HYSPEC and r["method"] != PLAIN and r["batch_size"] == 1
              and r["temperature"] == t0 and r["status"] == OK]
    methods = [r for r in batch1 if not is_ceiling(r["method"])]  # the oracle knew the answers: never "best"
    best = max(methods, key=_rate, default=None)
    best_name = _described(best, f"best: hyspec {best['method']}" if best else "speculative method")
    ceiling = max((r for r in batch1 if is_ceiling(r["method"])), key=_rate, default=None)
    ceiling_x = ratio(_rate(ceiling), plain_rate) if ceiling else None
    out.append(_goal("best method >= 2.5x hyspec plain decoding (batch 1)", 2.5,
                     ratio(_rate(best) if best else None, plain_rate),
                     f"{best_name} vs {_described(plain1, 'hyspec plain')}"
                     + ("" if ceiling_x is None else f"; oracle ceiling here {ceiling_x:.2f}x ({ceiling['method']})")))
    assisted = [r for r in rows if r["engine"] == TRANSFORMERS and r["method"] != "hf_generate"
                and r["batch_size"] == 1 and r["temperature"] == t0 and r["status"] == OK]
    best_hf = max(assisted, key=_rate, default=None)
    hf_name = _described(best_hf, f"best assisted: {best_hf['label']}" if best_hf else "transformers assisted")
    out.append(_goal("best method >= 2x the best transformers assisted generation (batch 1)", 2.0,
                     ratio(_rate(best) if best else None, _rate(best_hf) if best_hf else None),
                     f"{best_name} vs {hf_name}"))
    hybrid = {}
    for bs in GOAL_BATCH_SIZES:
        h, p = _find(rows, HYSPEC, "hybrid", bs, t0), _find(rows, HYSPEC, PLAIN, bs, t0)
        value = ratio(_rate(h) if h else None, _rate(p) if p else None)
        if value is not None:
            hybrid[bs] = value
    missing = [bs for bs in GOAL_BATCH_SIZES if bs not in hybrid]
    detail = ", ".join(f"bs {bs}: {v:.2f}x" for bs, v in hybrid.items()) or "hybrid not measured"
    if missing and hybrid:
        detail += f"; not measured at batch size {', '.join(map(str, missing))}"
    out.append(_goal("hybrid >= 0.95x plain decoding at every batch size in {1, 4, 16, 32}", 0.95,
                     min(hybrid.values()) if hybrid else None, detail, complete=not missing))
    out += _llamacpp_goals(rows, plain1, best, best_name)
    out += _vllm_goals(rows)
    limit = plain1.get("bandwidth_limit_tokens_per_s") if plain1 else None
    out.append(_goal("plain decoding within 2x of the memory-bandwidth limit (batch 1)", 0.5,
                     plain1.get("bandwidth_ratio") if plain1 else None,
                     f"{_described(plain1, 'hyspec plain')} vs a limit of "
                     + ("-" if limit is None else f"{limit:.1f} tok/s")))
    return out


def _llamacpp_goals(rows: list[dict[str, Any]], plain1: dict[str, Any] | None, best: dict[str, Any] | None,
                    best_name: str) -> list[dict[str, Any]]:
    """The CPU goals against llama.cpp on its own GGUF (only when the llama.cpp peers were asked for)."""
    lc = _find(rows, LLAMACPP, "llamacpp", 1, 0.0)
    lookup = _find(rows, LLAMACPP, "llamacpp_prompt_lookup", 1, 0.0)
    if lc is None and lookup is None:
        return []
    lc_rate, lookup_rate = (_rate(lc) if lc else None), (_rate(lookup) if lookup else None)
    plain_rate, best_rate = (_rate(plain1) if plain1 else None), (_rate(best) if best else None)
    return [
        _goal("hyspec plain decoding >= 1.0x llama.cpp plain (batch 1)", 1.0, ratio(plain_rate, lc_rate),
              f"{_described(plain1, 'hyspec plain')} vs {_described(lc, 'llama.cpp')}"),
        _goal("best method >= 2x llama.cpp plain (batch 1)", 2.0, ratio(best_rate, lc_rate),
              f"{best_name} vs {_described(lc, 'llama.cpp')}"),
        _goal("best method >= 2x llama.cpp prompt lookup (batch 1)", 2.0, ratio(best_rate, lookup_rate),
              f"{best_name} vs {_described(lookup, 'llama.cpp prompt lookup')}"),
    ]


VLLM_BUILTIN = ("vllm_ngram", "vllm_suffix", "vllm_eagle3")


def _vllm_goals(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Issues 46 and 51 against vLLM's CPU build (only when the vLLM peers were asked for).  Issue 46 states the
    first two for the agentic workload: the dataset name says which workload a run measured."""
    t0 = 0.0
    if not any(r["engine"] == VLLM for r in rows):
        return []
    plain1, ours1 = _find(rows, VLLM, "vllm", 1, t0), _find(rows, VLLM, "vllm_hyspec", 1, t0)
    builtin = [r for r in (_find(rows, VLLM, m, 1, t0) for m in VLLM_BUILTIN) if r is not None and _rate(r)]
    best = max(builtin, key=_rate, default=None)
    out = [_goal("vLLM + hyspec >= 1.5x vLLM plain (batch 1; issue 46: agentic)", 1.5,
                 ratio(_rate(ours1) if ours1 else None, _rate(plain1) if plain1 else None),
                 f"{_described(ours1, 'vLLM + hyspec')} vs {_described(plain1, 'vLLM plain')}"),
           _goal("vLLM + hyspec >= 1.3x vLLM's best built-in method (batch 1; issue 46: agentic)", 1.3,
                 ratio(_rate(ours1) if ours1 else None, _rate(best) if best else None),
                 f"{_described(ours1, 'vLLM + hyspec')} vs "
                 f"{_described(best, best['label'] if best else 'a vLLM method')}")]
    batch_sizes = sorted({r["batch_size"] for r in rows if r["engine"] == VLLM and r["temperature"] == t0})
    for name, target, engine, method in (
            ("vLLM + hyspec >= 0.97x vLLM plain at every batch size (issue 46)", 0.97, VLLM, "vllm_hyspec"),
            ("hyspec plain >= 1.5x vLLM plain at every batch size (issue 51)", 1.5, HYSPEC, PLAIN)):
        values = {}
        for bs in batch_sizes:
            a, b = _find(rows, engine, method, bs, t0), _find(rows, VLLM, "vllm", bs, t0)
            value = ratio(_rate(a) if a else None, _rate(b) if b else None)
            if value is not None:
                values[bs] = value
        detail = ", ".join(f"bs {bs}: {v:.2f}x" for bs, v in values.items()) or "not measured"
        out.append(_goal(name, target, min(values.values()) if values else None, detail,
                         complete=len(values) == len(batch_sizes)))
    return out


def identity_summary(rows: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """Which hyspec configurations were token-identical to plain decoding, and which were not."""
    checked, near, bad = [], [], []
    for r in rows:
        ident = r.get("identity")
        if r["engine"] != HYSPEC or r["status"] != OK or ident is None or ident["token_identical"] is None:
            continue
        where = {"method": r["method"], "batch_size": r["batch_size"], "temperature": r["temperature"],
                 "status": ident["status"], "details": ident["details"]}
        checked.append(where)
        if ident["status"] == MISMATCH:
            bad.append(where)
        elif ident["status"] == NEAR_TIE:
            near.append(where)
    return {"checked": len(checked), "all_identical": not bad and not near, "mismatches": bad, "near_ties": near}


@dataclass
class Document:
    """Everything that goes into the JSON, assembled by the runner."""

    command: list[str]
    machine: dict[str, Any]
    model: dict[str, Any]
    dataset: dict[str, Any]
    settings: dict[str, Any]
    bandwidth: dict[str, Any]
    drafters: dict[str, dict[str, Any]]
    memory_method: str
    rows: list[Row] = field(default_factory=list)
    complete: bool = True  # False: a checkpoint written mid-run (the rows so far)
    prefill: dict[str, Any] | None = None  # --prefill-tokens: one long prompt's prefill speed per engine

    def to_dict(self) -> dict[str, Any]:
        from datetime import datetime, timezone


        rows = [r.to_dict() for r in self.rows]
        copy_rate = self.bandwidth.get("copy", {}).get("bytes_per_s")
        derive(rows, self.model.get("decode_weight_bytes"), copy_rate, self.settings.get("price_per_hour"))
        failed = [f"{r['label']} bs {r['batch_size']} T {r['temperature']:g}: {r['reason']}"
                  for r in rows if r["engine"] == HYSPEC and r["status"] == FAILED]
        identity = identity_summary(rows)
        return {
            "schema_version": SCHEMA_VERSION,
            "kind": "hyspec-bench",
            "created_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "hyspec_version": __version__,
            "command": self.command,
            "machine": self.machine,
            "machine_label": machine_label(self.machine),
            "model": self.model,
            "dataset": self.dataset,
            "settings": self.settings,
            "bandwidth": self.bandwidth,
            "memory_method": self.memory_method,
            "drafters": self.drafters,
            "results": rows,
            "identity": identity,
            "failed": failed,
            "goals": goals(rows),
            "prefill": self.prefill,
            "passed": not identity["mismatches"] and not failed,
            "complete": self.complete,
        }
