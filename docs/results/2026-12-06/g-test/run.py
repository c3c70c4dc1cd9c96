"""G-tests of the engine-level distribution runs: is draft_model's low p (issue 50 item 6) chance or a bias?

The engine-level tests (tests/conformance/test_engine_distribution.py) send
seeded requests for one prompt through ``LLM.generate`` and compare the first
three tokens with the exact law from the target's own logits
(``hyspec.conformance.distribution``), outcome by outcome at 5 sigma.  This
script takes the same samples and the same law and asks the omnibus question
instead: a likelihood-ratio (G) test of the observed counts of (y1, y2), y2
and y3 against the law, outcomes with expected count < 5 pooled into one cell
(merged with the next-smallest cells until it reaches 5) as is standard;
df = cells - 1; p from the chi-square tail (scipy.stats).  A correct sampler
gives p-values uniform on [0, 1]: about 5 % of runs below 0.05, 1 % below
0.01.  An outcome the law forbids (p = 0) is counted apart ("impossible");
any is a failure by itself.

Each run is one method, one sampling setting, ``n`` requests and a seed
index ``s``: request i gets seed ``s * 1_000_003 + i`` (the test's rule,
``sample_through_generate``), so runs with different seed indexes never share
a seed while n < 1,000,003.  A run larger than ``--chunk`` is split into
chunks with consecutive seed indexes (each recorded).  The counts are saved
with the run, so independent runs can be pooled afterwards (``--summary``).

    .venv/bin/python docs/results/2026-12-06/g-test/run.py --method draft_model --setting issue \
        --n 20000 --seed-index 1
    .venv/bin/python docs/results/2026-12-06/g-test/run.py --summary
"""
from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import os
import platform
import shutil
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from hyspec import LLM
from hyspec.conformance import distribution
from hyspec.conformance.methods import (
    CONTROLLER_OFF,
    Workspace,
    method_config,
    methods_to_check,
)
from hyspec.conformance.tiny import prompts
from scipy.stats import chi2

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results.json"
SEED_STRIDE = 1_000_003  # sample_through_generate's seed rule
MIN_EXPECTED = 5.0
#: sampling settings: the suite's own PARAMS and the issue's (top-k 12 instead of 8)
SETTINGS = {"suite": dict(distribution.PARAMS), "issue": {"temperature": 0.8, "top_k": 12, "top_p": 0.9}}
PLAIN = "plain"  # no speculation: the control, whose p-values must be uniform
NOISY = "draft_model (noisy self)"  # the target's weights plus noise as the drafter (noisy_self_drafter)
NOISE_SCALES = (0.03, 0.1, 0.3)
REMOTE = "remote"  # draft_model on an in-process remote worker, as the test's REMOTE case
#: draft_model variants for localising a bias: (name, overrides of its speculative_config)
VARIANTS = {"k1": {"num_speculative_tokens": 1}, "k2": {"num_speculative_tokens": 2},
            "dense": {"quantization": "none"}}


@contextlib.contextmanager
def sampling_setting(name: str) -> Iterator[dict[str, Any]]:
    """distribution.PARAMS switched to the setting ``name`` inside the block (its law and requests use it)."""
    saved = dict(distribution.PARAMS)
    distribution.PARAMS.update(SETTINGS[name])
    try:
        yield dict(distribution.PARAMS)
    finally:
        distribution.PARAMS.clear()
        distribution.PARAMS.update(saved)


def engine(ws: Workspace, spec: dict[str, Any] | None = None) -> LLM:
    """The test's engine (test_engine_distribution.engine)."""
    return LLM(str(ws.target_dir), dtype="float32", kv_cache_bytes=32 << 20, max_model_len=256, max_num_seqs=256,
               speculative_config=spec)


def method_spec(ws: Workspace, method: str) -> dict[str, Any] | None:
    if method.startswith(NOISY + "@"):
        model = noisy_self_drafter(ws, float(method.split("@")[1]))
        return {**CONTROLLER_OFF, "method": "draft_model", "model": str(model), "num_speculative_tokens": 4,
                "quantization": "none"}
    base, _, variant = method.partition("+")
    if base == PLAIN:
        return None
    if base == REMOTE:
        return {**CONTROLLER_OFF, "method": "draft_model", "model": str(ws.drafter("draft_model")),
                "num_speculative_tokens": 4, "draft_placement": "remote", "remote": {"draft_deadline_ms": 5000}}
    spec = {**CONTROLLER_OFF, **method_config(base, ws)}
    if variant:
        spec.update(VARIANTS[variant])
    return spec


def noisy_self_drafter(ws: Workspace, scale: float) -> Path:
    """The target's own weights plus Gaussian noise of ``scale`` times each tensor's spread, saved as a
    draft_model checkpoint: q near p but not equal, so drafts are accepted often and rejected often -- the
    regime a random drafter (accepted ~4 %) and the exact self-draft (accepted always) both miss."""
    from safetensors.torch import load_file, save_file

    out = ws.root / f"noisy-self-{scale:g}"
    if not out.exists():
        out.mkdir()
        for f in ws.target_dir.iterdir():
            if f.name != "model.safetensors":
                shutil.copy(f, out / f.name)
        g = torch.Generator().manual_seed(0)
        tensors = load_file(ws.target_dir / "model.safetensors")
        save_file({name: t + scale * t.float().std() * torch.randn(t.shape, generator=g) if t.numel() > 1 else t
                   for name, t in tensors.items()}, out / "model.safetensors", metadata={"format": "pt"})
    return out


@contextlib.contextmanager
def remote_in_process(active: bool) -> Iterator[None]:
    """Build remote proposers on in-process workers (the test's remote_placement(inprocess_handles()))."""
    if not active:
        yield
        return
    from hyspec.remote.factory import build_remote_proposer, worker_init
    from hyspec.remote.transport import InProcessHandle
    from hyspec.remote.worker import build_host
    from hyspec.spec import decoder

    original = decoder.build_proposer

    def build(eng, spec):
        if getattr(spec.config, "draft_placement", "local") != "remote":
            return original(eng, spec)
        init = worker_init(eng, spec)
        return build_remote_proposer(eng, spec, handles=[InProcessHandle(lambda: build_host(init))])

    decoder.build_proposer = build
    try:
        yield
    finally:
        decoder.build_proposer = original


def g_test(counts: dict[Any, int], law: dict[Any, float], n: int) -> dict[str, Any]:
    """G = 2 sum O ln(O / E) over the support, cells with E < MIN_EXPECTED pooled; p from chi2(cells - 1)."""
    impossible = sum(c for k, c in counts.items() if law.get(k, 0.0) == 0.0)
    cells = sorted(((n * p, counts.get(k, 0), k) for k, p in law.items() if p > 0), key=lambda c: c[0])
    pooled_e, pooled_o, pooled_keys = 0.0, 0, []
    # every cell under MIN_EXPECTED goes into the pool; a pool still under it takes the next-smallest cells
    while cells and (cells[0][0] < MIN_EXPECTED or 0 < pooled_e < MIN_EXPECTED):
        e, o, k = cells.pop(0)
        pooled_e, pooled_o = pooled_e + e, pooled_o + o
        pooled_keys.append(k)
    groups = [(e, o, str(k)) for e, o, k in cells]
    if pooled_keys:
        groups.append((pooled_e, pooled_o, f"pooled({len(pooled_keys)})"))
    g = 2.0 * sum(o * math.log(o / e) for e, o, _ in groups if o > 0)
    pearson = sum((o - e) ** 2 / e for e, o, _ in groups)
    df = len(groups) - 1
    # standardised residual of a multinomial cell: (O - E) / sqrt(E (1 - E/n))
    resid = sorted(((o - e) / math.sqrt(e * (1 - e / n)) if e < n else 0.0, name, o, round(e, 1))
                   for e, o, name in groups)
    worst = sorted(resid, key=lambda r: -abs(r[0]))[:5]
    return {"G": round(g, 3), "df": df, "p": float(chi2.sf(g, df)), "pearson_X2": round(pearson, 3),
            "p_pearson": float(chi2.sf(pearson, df)), "cells": len(groups), "pooled_outcomes": len(pooled_keys),
            "impossible": impossible,
            "worst_residuals": [{"cell": name, "z": round(z, 2), "observed": o, "expected": e}
                                for z, name, o, e in worst]}


def law_tables(law: distribution.ExactLaw) -> dict[str, dict[Any, float]]:
    return {"y1y2": law.joint12, "y2": law.y2, "y3": law.y3}


def count_samples(samples: list[list[int]]) -> dict[str, Counter]:
    return {"y1y2": Counter((a, b) for a, b, _ in samples), "y2": Counter(s[1] for s in samples),
            "y3": Counter(s[2] for s in samples)}


def machine() -> dict[str, Any]:
    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), platform.processor())
    return {"cpu": model, "cores": os.cpu_count(), "note": "2-core AMD EPYC VM (Zen 3 class, AVX2, no AVX-512), "
            "shared with 4 other agents' jobs", "torch": torch.__version__, "torch_threads": torch.get_num_threads()}


def run_one(ws: Workspace, method: str, setting: str, n: int, seed_index: int, chunk: int,
            max_tokens: int = 3) -> dict[str, Any]:
    with sampling_setting(setting) as params:
        plain = engine(ws)
        prompt = distribution.lookup_prompt(plain.engine, prompts(6)[3])
        law = distribution.exact_law(plain.engine, prompt)
        started = time.perf_counter()
        with remote_in_process(method.startswith(REMOTE)):
            llm = engine(ws, method_spec(ws, method))
        samples, seeds = [], []
        try:
            done, index = 0, seed_index
            while done < n:
                size = min(chunk, n - done)
                samples += distribution.sample_through_generate(llm, prompt, size, seed=index, max_tokens=max_tokens)
                seeds.append({"seed_index": index, "first": index * SEED_STRIDE, "last": index * SEED_STRIDE + size - 1})
                done, index = done + size, index + 1
            totals = (llm.engine.spec.metrics.snapshot()["totals"] if method != PLAIN
                      else {"draft_tokens": 0, "accepted_tokens": 0})
        finally:
            if method != PLAIN:
                llm.engine.spec.close()
        wall = time.perf_counter() - started
    short = sum(len(s) != 3 for s in samples)
    if short:
        raise RuntimeError(f"{method}: {short} requests returned fewer than 3 tokens")
    counts = count_samples(samples)
    tables = law_tables(law)
    tests = {name: g_test(counts[name], tables[name], n) for name in tables}
    return {"method": method, "setting": setting, "params": params, "max_tokens": max_tokens, "n": n, "seeds": seeds, "prompt": prompt,
            "drafted": totals["draft_tokens"], "accepted": totals["accepted_tokens"], "wall_s": round(wall, 1),
            "tests": tests, "counts": {name: [[_key(k), c] for k, c in sorted(counts[name].items())]
                                       for name in counts},
            "law": {name: [[_key(k), p] for k, p in sorted(tables[name].items())] for name in tables}}


def _key(k: Any) -> Any:
    return list(k) if isinstance(k, tuple) else k


def load(path: Path) -> dict[str, Any]:
    if path.exists():
        return json.loads(path.read_text())
    return {"machine": machine(), "min_expected": MIN_EXPECTED, "seed_rule": f"seed_index * {SEED_STRIDE} + i",
            "runs": []}


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    import fcntl

    with open(path.with_suffix(".lock"), "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def save(data: dict[str, Any], path: Path) -> None:
    """The summaries recomputed; each setting's law stored once, each run on one line (counts, seeds)."""
    laws = data.setdefault("laws", {})
    for run in data["runs"]:
        law = run.pop("law", None)
        if law is not None and laws.setdefault(run["setting"], law) != law:
                raise RuntimeError(f"two laws for setting {run['setting']}: the target or prompt changed")
    data["summary"] = summary(data["runs"], laws)
    data["uniformity"] = uniformity(data["runs"])
    head = json.dumps({k: v for k, v in data.items() if k not in ("runs", "laws")}, indent=1)
    body = ",\n".join(json.dumps(r, separators=(",", ":")) for r in data["runs"])
    tmp = path.with_suffix(".tmp")
    tmp.write_text(head[:-2] + ',\n "laws": ' + json.dumps(laws, separators=(",", ":"))
                   + ',\n "runs": [\n' + body + "\n ]\n}\n")
    tmp.replace(path)


def summary(runs: list[dict[str, Any]], laws: dict[str, Any]) -> dict[str, Any]:
    """Per (method, setting): each run's joint p, how many fall below 0.05 / 0.01, and the pooled G-test."""
    out: dict[str, Any] = {}
    for run in runs:
        out.setdefault(group_key(run), []).append(run)
    table = {}
    for key, group in out.items():
        entry = {"runs": len(group), "n_total": sum(r["n"] for r in group),
                 "p_y1y2": [round(r["tests"]["y1y2"]["p"], 4) for r in group],
                 "p_y2": [round(r["tests"]["y2"]["p"], 4) for r in group],
                 "p_y3": [round(r["tests"]["y3"]["p"], 4) for r in group],
                 "below_0.05": sum(r["tests"]["y1y2"]["p"] < 0.05 for r in group),
                 "below_0.01": sum(r["tests"]["y1y2"]["p"] < 0.01 for r in group)}
        law = {_hashable(k): p for k, p in laws[group[0]["setting"]]["y1y2"]}
        df = group[0]["tests"]["y1y2"]["df"]
        entry["detectable_shift"] = {"one run": round(detectable_shift(law, max(r["n"] for r in group), df), 4),
                                     "pooled": round(detectable_shift(law, entry["n_total"], df), 4)}
        if len(group) > 1:  # the runs use disjoint seeds: their counts add up to one bigger sample
            entry["pooled"] = pooled(group, laws[group[0]["setting"]])
        table[key] = entry
    return table


def detectable_shift(law: dict[Any, float], n: int, df: int, alpha: float = 0.05, power: float = 0.9) -> float:
    """The probability mass moved between the two likeliest (y1, y2) outcomes that the G-test at ``alpha``
    detects with probability ``power`` at ``n`` requests (the hardest pair to see a shift in).

    Under a shift d from outcome a to b the statistic is ~ noncentral chi2(df, lam) with
    lam = n d^2 (1/p_a + 1/p_b); solve for the lam that gives ``power``, then for d."""
    from scipy.optimize import brentq
    from scipy.stats import ncx2

    critical = chi2.isf(alpha, df)
    lam = brentq(lambda x: ncx2.sf(critical, df, x) - power, 1e-6, 1e4)
    p_a, p_b = sorted(law.values())[-2:]
    return math.sqrt(lam / (n * (1 / p_a + 1 / p_b)))


def uniformity(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Every run's p-values together: a correct engine gives uniform ones (KS test, share below 0.05 / 0.01)."""
    from scipy.stats import kstest

    out = {}
    for label, chosen in (("speculative runs", [r for r in runs if r["method"] != PLAIN]), ("all runs", runs)):
        for test in ("y1y2", "y2", "y3"):
            ps = [r["tests"][test]["p"] for r in chosen]
            if ps:
                out[f"{label}: {test}"] = {"p_values": len(ps), "below_0.05": sum(p < 0.05 for p in ps),
                                           "below_0.01": sum(p < 0.01 for p in ps),
                                           "ks_uniform_p": round(float(kstest(ps, "uniform").pvalue), 4)}
    return out


def pooled(group: list[dict[str, Any]], laws: dict[str, Any]) -> dict[str, Any]:
    n = sum(r["n"] for r in group)
    result = {}
    for name in ("y1y2", "y2", "y3"):
        counts: Counter = Counter()
        for r in group:
            counts.update({_hashable(k): c for k, c in r["counts"][name]})
        law = {_hashable(k): p for k, p in laws[name]}
        t = g_test(counts, law, n)
        result[name] = {k: t[k] for k in ("G", "df", "p", "impossible", "worst_residuals")}
    return result


def self_check(laws: dict[str, Any], sizes: tuple[int, ...] = (10000, 20000), reps: int = 2000) -> dict[str, Any]:
    """The G-test's calibration: multinomial samples drawn from each setting's exact joint law (numpy, no
    engine) must give uniform p-values -- about 5 % below 0.05 -- whatever the pooling does to small cells."""
    import numpy as np
    from scipy.stats import kstest

    out = {}
    for setting, law in laws.items():
        keys = [_hashable(k) for k, _ in law["y1y2"]]
        probs = np.array([p for _, p in law["y1y2"]])
        for n in sizes:
            rng = np.random.default_rng(12345)
            ps = np.array([g_test(dict(zip(keys, draw.tolist())), dict(zip(keys, probs.tolist())), n)["p"]
                           for draw in rng.multinomial(n, probs / probs.sum(), size=reps)])
            out[f"{setting}, n {n}"] = {"replications": reps, "below_0.05": float((ps < 0.05).mean()),
                                        "below_0.01": float((ps < 0.01).mean()),
                                        "ks_uniform_p": round(float(kstest(ps, "uniform").pvalue), 4)}
    return out


def group_key(run: dict[str, Any]) -> str:
    """Runs pooled together: one method, one setting, one max_tokens (more tokens let drafts run deeper)."""
    deeper = f", max_tokens {run['max_tokens']}" if run.get("max_tokens", 3) != 3 else ""
    return f"{run['method']} @ {run['setting']}{deeper}"


def markdown_table(data: dict[str, Any]) -> str:
    """The README's table: per method and setting, each run's p of the joint law, and the pooled test."""
    header = ("| method @ setting | runs x n | p(y1,y2) per run | < 0.05 / < 0.01 | pooled n | pooled G (df), p: "
              "y1y2 / y2 / y3 | shift detected (1 run / pooled) |")
    rows = [header, "|---|---|---|---|---|---|---|"]
    for key, e in data["summary"].items():
        sizes = sorted({r["n"] for r in data["runs"] if group_key(r) == key})
        pool = e.get("pooled")
        pooled_text = ("; ".join(f"{pool[t]['G']:.1f} ({pool[t]['df']}), {pool[t]['p']:.3f}" for t in ("y1y2", "y2", "y3"))
                       if pool else "-")
        rows.append(f"| {key} | {e['runs']} x {'/'.join(f'{s:,}' for s in sizes)} | "
                    f"{', '.join(f'{p:.3f}' for p in e['p_y1y2'])} | {e['below_0.05']} / {e['below_0.01']} | "
                    f"{e['n_total']:,} | {pooled_text} | {e['detectable_shift']['one run']:.1%} / "
                    f"{e['detectable_shift']['pooled']:.1%} |")
    return "\n".join(rows)


def _hashable(k: Any) -> Any:
    return tuple(k) if isinstance(k, list) else k


def main() -> None:
    choices = [PLAIN, *methods_to_check(), REMOTE, *(f"draft_model+{v}" for v in VARIANTS),
               *(f"{NOISY}@{scale:g}" for scale in NOISE_SCALES)]
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--method", action="append", choices=choices, help="repeatable; default: none (with --summary)")
    ap.add_argument("--setting", choices=sorted(SETTINGS), default="suite")
    ap.add_argument("--n", type=int, default=3000)
    ap.add_argument("--seed-index", type=int, default=1, help="first seed index (0 is the test's own seeds)")
    ap.add_argument("--repeats", type=int, default=1, help="independent runs per method (the next seed indexes)")
    ap.add_argument("--max-tokens", type=int, default=3,
                    help="tokens per request (> 3 lets drafts reach past the third token; the law is the first 3's)")
    ap.add_argument("--chunk", type=int, default=20000, help="requests per LLM.generate call")
    ap.add_argument("--out", type=Path, default=RESULTS, help="the JSON the runs are appended to")
    ap.add_argument("--self-check", action="store_true", help="the G-test's calibration on the saved laws")
    ap.add_argument("--table", action="store_true", help="print the summary as the README's markdown table")
    ap.add_argument("--summary", action="store_true", help="recompute and print the summary")
    args = ap.parse_args()
    if not 0 < args.n < SEED_STRIDE or not 0 < args.chunk or args.repeats < 1 or args.max_tokens < 3:
        ap.error(f"--n must be in 1..{SEED_STRIDE - 1}, --chunk and --repeats positive, --max-tokens >= 3")
    logging.getLogger("hyspec.spec.quality").setLevel(logging.ERROR)  # random drafters are rejected on purpose
    data = load(args.out)
    ws = Workspace.create() if args.method else None
    try:
        per_run = -(-args.n // args.chunk)  # seed indexes one run uses
        for method, repeat in [(m, r) for m in args.method or [] for r in range(args.repeats)]:
            first = args.seed_index + repeat * per_run
            run = run_one(ws, method, args.setting, args.n, first, args.chunk, args.max_tokens)
            with locked(args.out):  # plan.sh runs two invocations side by side, both appending here
                data = load(args.out)
                data["runs"].append(run)
                save(data, args.out)
            j = run["tests"]["y1y2"]
            print(f"{group_key(run)} n={args.n} seeds from index {first}: y1y2 G={j['G']} "
                  f"df={j['df']} p={j['p']:.4g}; y2 p={run['tests']['y2']['p']:.4g}; "
                  f"y3 p={run['tests']['y3']['p']:.4g}; {run['wall_s']} s", flush=True)
    finally:
        if ws is not None:
            ws.close()
    if args.self_check:
        with locked(args.out):
            data = load(args.out)
            save(data, args.out)  # moves the runs' laws into data["laws"]
            data["self_check"] = self_check(data["laws"])
            save(data, args.out)
        print(json.dumps(data["self_check"], indent=1))
    if args.summary:
        save(data, args.out)
        print(json.dumps(data["summary"], indent=1))
    if args.table:
        data = load(args.out)
        print(markdown_table(data))
        print("\n| p-values of | count | < 0.05 | < 0.01 | KS vs uniform, p |\n|---|---|---|---|---|")
        for key, u in data.get("uniformity", {}).items():
            print(f"| {key} | {u['p_values']} | {u['below_0.05']} | {u['below_0.01']} | {u['ks_uniform_p']} |")


if __name__ == "__main__":
    main()
