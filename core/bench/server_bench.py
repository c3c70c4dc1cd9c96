"""Server throughput with and without speculation, at 1, 4, 16 and 32 concurrent streaming clients.

For each configuration (``plain``, ``hybrid``, and fixed methods such as
``ngram``) it starts ``hyspec serve`` in a subprocess on 127.0.0.1,
warms it up, then for each client count runs that many closed-loop streaming
clients (each sends the next greedy request as soon as its last one ended) for
``--duration`` seconds, and stops the server.  It reports per cell:

  * tokens/s: streamed tokens / wall time (until the last started request ended),
  * TTFT p50/p99 (request sent -> first token) and TPOT p50/p99 (per request:
    time from first to last token / (tokens - 1)), as the clients saw them,
  * speed-up over plain at the same client count (goal: hybrid >= 0.95x everywhere),
  * for speculative servers, from /metrics: dispatcher decisions by method and
    the dispatcher's decision latency p50/p99 (its snapshot of the last 4096
    decisions), drafted and accepted tokens,
  * the client process's CPU use: near 100 % of a core means the client, not
    the server, limited the figure (run fewer clients per process then).

Every request is greedy (temperature 0, ignore_eos, fixed max_tokens), so the
first output of each prompt under speculation is compared with plain's: a
difference is reported (on bf16/fp16 targets it can be a near-tie, see
docs/architecture.md §4; ``hyspec bench`` classifies those).

``hyspec bench-server`` runs it (its options: hyspec.cli.bench_server).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import platform
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from hyspec.assets import default_drafter, default_model
from hyspec.backends.registry import get_backend
from hyspec.bench.machine import machine_info, machine_label
from hyspec.bench.prompts import build_prompt_set, humaneval_prompts, read_prompt_file
from hyspec.bench.serve_process import free_port, wait_until_healthy
from hyspec.bench.server_load import percentile, stream_once
from hyspec.conformance.tiny import TinySpec, make_tiny_target
from hyspec.errors import CheckpointError
from hyspec.model.config import ModelConfig
from hyspec.model.tokenizer import Tokenizer
from hyspec.spec.registry import drafter_methods  # the methods with drafter weights

PLAIN, HYBRID = "plain", "hybrid"
GOAL_RATIO = 0.95  # hybrid tokens/s over plain's, at every client count
CODE_PROMPTS = ["def add(a, b):\n    return a + b\n\ndef sub(a, b):\n", "import os\nimport sys\n\n\ndef main(",
                "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, x):\n",
                "for i in range(10):\n    for j in range(i):\n        print(i, j)\n", "def fib(n):\n    if n < 2:\n",
                "with open(path) as f:\n    for line in f:\n", "try:\n    import json\nexcept ImportError:\n",
                "@property\ndef name(self):\n    return self._name\n\n@property\ndef"]


# -- one streaming request ---------------------------------------------------------------------------------

@dataclass
class Sample:
    prompt_index: int
    token_ids: list[int]
    ttft: float | None = None
    tpot: float | None = None
    error: str | None = None


async def stream_request(client: httpx.AsyncClient, index: int, prompt: list[int], max_tokens: int) -> Sample:
    """One greedy streamed completion of ``prompt`` (token ids), as the load test sends it."""
    r = await stream_once(client, None, prompt, max_tokens)
    return Sample(index, r.token_ids, ttft=r.ttft, tpot=r.tpot, error=r.error)


async def run_clients(url: str, prompts: list[list[int]], clients: int, duration: float,
                      max_tokens: int) -> tuple[list[Sample], float, float]:
    """``clients`` closed-loop streams for ``duration`` s -> (samples, wall seconds, client CPU seconds)."""
    limits = httpx.Limits(max_connections=clients + 2, max_keepalive_connections=clients + 2, keepalive_expiry=2.0)
    samples: list[Sample] = []
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=httpx.Timeout(duration + 600)) as client:
        deadline = time.perf_counter() + duration

        async def loop(c: int) -> None:
            k = 0
            while time.perf_counter() < deadline:
                index = (c + k * clients) % len(prompts)
                samples.append(await stream_request(client, index, prompts[index], max_tokens))
                k += 1

        cpu0, t0 = time.process_time(), time.perf_counter()
        await asyncio.gather(*(loop(c) for c in range(clients)))
        return samples, time.perf_counter() - t0, time.process_time() - cpu0


async def warm_up(url: str, prompts: list[list[int]], max_tokens: int, count: int = 4) -> list[Sample]:
    """A few untimed requests at once: first-call allocations and lazy initialisation are not measured."""
    async with httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(600)) as client:
        return list(await asyncio.gather(*(stream_request(client, i, prompts[i], max_tokens)
                                           for i in range(min(count, len(prompts))))))


# -- the server under test ---------------------------------------------------------------------------------

class ServerProcess:
    """``hyspec serve`` in a subprocess on a free loopback port; its log goes to ``log_path``."""

    def __init__(self, args: argparse.Namespace, model: str, spec_config: dict[str, Any] | None, log_path: Path):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        cmd = [sys.executable, "-m", "hyspec.cli.main", "serve", "--model", model, "--port", str(self.port),
               "--backend", args.backend, "--dtype", args.dtype, "--max-num-seqs", str(args.max_num_seqs),
               "--max-queue", str(args.max_num_seqs), "--log-level", "warning"]
        for flag, value in (("--max-model-len", args.max_model_len), ("--kv-cache-bytes", args.kv_cache_bytes)):
            if value is not None:
                cmd += [flag, str(value)]
        if spec_config is not None:
            cmd += ["--speculative-config", json.dumps(spec_config)]
        self._log = open(log_path, "w")
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT)

    def wait_ready(self, timeout: float) -> None:
        try:
            wait_until_healthy(self.url, self.proc, timeout, lambda: ":\n" + self.log_tail(), interval_s=0.25)
        except TimeoutError:
            self.stop()
            raise

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)  # graceful: drains, then exits
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()

    def log_tail(self, lines: int = 30) -> str:
        self._log.flush()
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])


def scrape(url: str) -> dict[str, Any]:
    """Dispatcher and speculation figures from /metrics (absent ones are left out)."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, Any] = {"decisions": {}, "draft_tokens": 0.0, "accepted_tokens": 0.0}
    for fam in text_string_to_metric_families(httpx.get(url + "/metrics", timeout=30).text):
        for s in fam.samples:
            if s.name == "hyspec_dispatch_decisions_total":
                out["decisions"][s.labels["method"]] = s.value
            elif s.name == "hyspec_dispatch_decision_latency_seconds":
                out[f"decision_p{round(float(s.labels['quantile']) * 100)}_us"] = s.value * 1e6
            elif s.name == "hyspec_dispatch_load_fallback_steps_total":
                out["load_fallback_steps"] = s.value
            elif s.name in ("hyspec_spec_draft_tokens_total", "hyspec_spec_accepted_tokens_total"):
                key = s.name[len("hyspec_spec_"):-len("_total")]
                out[key] += s.value
    return out


# -- one configuration -------------------------------------------------------------------------------------

def cell(config: str, clients: int, samples: list[Sample], wall: float, cpu: float, before: dict[str, Any],
         after: dict[str, Any]) -> dict[str, Any]:
    ok = [s for s in samples if s.error is None]
    ttfts = [s.ttft for s in ok if s.ttft is not None]
    tpots = [s.tpot for s in ok if s.tpot is not None]
    tokens = sum(len(s.token_ids) for s in ok)
    row = {"config": config, "clients": clients, "requests": len(ok), "errors": len(samples) - len(ok),
           "first_error": next((s.error for s in samples if s.error), None), "tokens": tokens, "wall_s": wall,
           "tokens_per_s": tokens / wall if wall else 0.0,
           "ttft_p50_s": percentile(ttfts, 50), "ttft_p99_s": percentile(ttfts, 99),
           "tpot_p50_s": percentile(tpots, 50), "tpot_p99_s": percentile(tpots, 99),
           "client_cpu_share": cpu / wall if wall else None}
    if after.get("decisions") or after.get("draft_tokens"):
        drafted = after["draft_tokens"] - before.get("draft_tokens", 0.0)
        accepted = after["accepted_tokens"] - before.get("accepted_tokens", 0.0)
        row["decisions"] = {m: n - before.get("decisions", {}).get(m, 0.0) for m, n in after["decisions"].items()}
        row["draft_tokens"], row["accepted_tokens"] = drafted, accepted
        row["acceptance_rate"] = accepted / drafted if drafted else None
        row["decision_p50_us"], row["decision_p99_us"] = after.get("decision_p50_us"), after.get("decision_p99_us")
    return row


def run_config(name: str, spec_config: dict[str, Any] | None, args: argparse.Namespace, model: str,
               prompts: list[list[int]], log_dir: Path) -> tuple[list[dict[str, Any]], dict[int, list[int]]]:
    """All client counts against one server; returns the rows and each prompt's first output."""
    server = ServerProcess(args, model, spec_config, log_dir / f"server-{name}.log")
    rows, first_output = [], {}
    try:
        server.wait_ready(args.startup_timeout)
        warm = asyncio.run(warm_up(server.url, prompts, args.max_tokens))
        if any(s.error for s in warm):
            raise RuntimeError(f"{name}: warm-up request failed: {next(s.error for s in warm if s.error)}")
        for clients in args.clients:
            before = scrape(server.url)
            samples, wall, cpu = asyncio.run(run_clients(server.url, prompts, clients, args.duration,
                                                         args.max_tokens))
            rows.append(cell(name, clients, samples, wall, cpu, before, scrape(server.url)))
            for s in samples:
                if s.error is None:
                    first_output.setdefault(s.prompt_index, s.token_ids)
            print(f"  {name:>12} x{clients:<3} {rows[-1]['tokens_per_s']:9.1f} tok/s  "
                  f"({rows[-1]['requests']} requests, {rows[-1]['errors']} errors)", file=sys.stderr, flush=True)
    finally:
        server.stop()
    return rows, first_output


def run_interleaved(configs: dict[str, dict[str, Any] | None], args: argparse.Namespace, model: str,
                    prompts: list[list[int]], log_dir: Path) -> tuple[list[dict[str, Any]], dict[str, dict[int, list[int]]]]:
    """Every configuration's server at once; per client count, ``--rounds`` rounds of one cell per configuration.

    On a shared VM throughput drifts by 10-20 % over minutes, so configurations measured one after the
    other differ by the drift too; alternating them within each client count puts every configuration
    under the same drift.  A row sums its rounds (tokens over wall time) and lists each round's figure.
    """
    servers = {name: ServerProcess(args, model, spec, log_dir / f"server-{name}.log") for name, spec in configs.items()}
    rows, outputs = [], {name: {} for name in configs}
    try:
        for name, server in servers.items():  # one at a time: start-ups compete for the same cores
            server.wait_ready(args.startup_timeout)
            warm = asyncio.run(warm_up(server.url, prompts, args.max_tokens))
            if any(s.error for s in warm):
                raise RuntimeError(f"{name}: warm-up request failed: {next(s.error for s in warm if s.error)}")
        for clients in args.clients:
            acc = {name: {"samples": [], "wall": 0.0, "cpu": 0.0, "rounds": [], "before": scrape(srv.url)}
                   for name, srv in servers.items()}
            for _ in range(args.rounds):
                for name, server in servers.items():
                    samples, wall, cpu = asyncio.run(run_clients(server.url, prompts, clients, args.duration,
                                                                 args.max_tokens))
                    a = acc[name]
                    a["samples"] += samples
                    a["wall"] += wall
                    a["cpu"] += cpu
                    a["rounds"].append(sum(len(x.token_ids) for x in samples if x.error is None) / wall)
            for name, server in servers.items():
                a = acc[name]
                row = cell(name, clients, a["samples"], a["wall"], a["cpu"], a["before"], scrape(server.url))
                row["round_tokens_per_s"] = a["rounds"]
                rows.append(row)
                for x in a["samples"]:
                    if x.error is None:
                        outputs[name].setdefault(x.prompt_index, x.token_ids)
                print(f"  {name:>12} x{clients:<3} {row['tokens_per_s']:9.1f} tok/s  (rounds: "
                      f"{', '.join(f'{v:.1f}' for v in a['rounds'])}; {row['requests']} requests, "
                      f"{row['errors']} errors)", file=sys.stderr, flush=True)
    finally:
        for server in servers.values():
            server.stop()
    return rows, outputs


# -- configurations ----------------------------------------------------------------------------------------

def load_json_arg(text: str, option: str) -> dict[str, Any]:
    """A JSON object given inline or as a path to a file holding one."""
    source = Path(text).read_text() if not text.lstrip().startswith("{") and Path(text).is_file() else text
    try:
        value = json.loads(source)
    except json.JSONDecodeError as exc:
        raise SystemExit(f"hyspec bench-server: {option}: not a JSON object nor a readable file: {exc}")
    if not isinstance(value, dict):
        raise SystemExit(f"hyspec bench-server: {option}: expected a JSON object")
    return value


def method_config(method: str, k: int, drafters: dict[str, str]) -> dict[str, Any]:
    config: dict[str, Any] = {"method": method, "num_speculative_tokens": k}
    if method == "ngram":
        config.update(prompt_lookup_min=1, prompt_lookup_max=3)
    elif method in drafter_methods():
        if method not in drafters:
            raise SystemExit(f"hyspec bench-server: no drafter weights for {method!r} (found: {', '.join(drafters) or 'none'})"
                             f"; pass --config {method}=JSON with a model")
        config["model"] = drafters[method]
    return config


def default_configs(args: argparse.Namespace, drafters: dict[str, str],
                    rules_path: str | None) -> dict[str, dict[str, Any] | None]:
    configs: dict[str, dict[str, Any] | None] = {}
    for name in args.configs:
        if name == PLAIN:
            configs[name] = None
        elif name == HYBRID:
            if args.speculative_config:
                configs[name] = load_json_arg(args.speculative_config, "--speculative-config")
                continue
            methods = [method_config("ngram", args.num_speculative_tokens, drafters)]
            methods += [{"method": m, "model": p} for m, p in drafters.items()]
            for m in methods:
                m.pop("num_speculative_tokens", None)
            configs[name] = {"method": HYBRID, "num_speculative_tokens": args.num_speculative_tokens,
                             "hybrid": {"methods": methods, "rules_path": rules_path}}
        else:
            configs[name] = method_config(name, args.num_speculative_tokens, drafters)
    for item in args.config:
        name, _, text = item.partition("=")
        configs[name] = load_json_arg(text, f"--config {name}")
    return configs


def embedded_drafters() -> dict[str, str]:
    found = {}
    for method in drafter_methods():
        try:
            found[method] = str(default_drafter(method))
        except CheckpointError:
            pass
    return found


def tiny_models(workdir: Path) -> tuple[str, dict[str, str], str]:
    """The conformance suite's tiny random target, a one-layer draft model with the same tokenizer, and rules
    that use both."""
    target, draft = workdir / "tiny-target", workdir / "tiny-draft"
    make_tiny_target(target, TinySpec(layers=2, seed=0))
    make_tiny_target(draft, TinySpec(layers=1, seed=7))
    rules = workdir / "tiny-rules.json"
    rules.write_text(json.dumps([{"when": "batch_size <= 4", "method": "draft_model"}, {"method": "ngram"}]))
    return str(target), {"draft_model": str(draft)}, str(rules)


def build_prompts(args: argparse.Namespace, model: str) -> tuple[list[list[int]], dict[str, Any]]:
    if args.prompts:
        texts, name = read_prompt_file(Path(args.prompts)), args.prompts
    elif args.tiny:
        texts, name = CODE_PROMPTS, "code snippets"
    else:
        texts, name = humaneval_prompts(), "humaneval"
    context = args.max_model_len or ModelConfig.raw_dict(model)["max_position_embeddings"]  # a directory or a GGUF
    room = min(args.max_prompt_tokens, context - args.max_tokens)
    tokenizer = Tokenizer(model)
    prompt_set = build_prompt_set(texts, name, tokenizer.encode, args.num_prompts, room)
    return [list(ids) for ids in prompt_set.token_ids], prompt_set.summary()


# -- report ------------------------------------------------------------------------------------------------

def speedups(rows: list[dict[str, Any]]) -> None:
    plain = {r["clients"]: r["tokens_per_s"] for r in rows if r["config"] == PLAIN}
    for r in rows:
        base = plain.get(r["clients"])
        r["speedup_vs_plain"] = r["tokens_per_s"] / base if base else None


def goal(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    ratios = {r["clients"]: r["speedup_vs_plain"] for r in rows if r["config"] == HYBRID}
    if not ratios or any(v is None for v in ratios.values()):
        return None
    return {"goal": f"hybrid >= {GOAL_RATIO}x plain tokens/s at every client count", "ratios": ratios,
            "met": all(v >= GOAL_RATIO for v in ratios.values())}


def format_table(rows: list[dict[str, Any]]) -> str:
    def ms(v: float | None) -> str:
        return "-" if v is None else f"{v * 1e3:.1f}"

    def us(v: float | None) -> str:
        return "-" if v is None else f"{v:.1f}"

    head = ["config", "clients", "tok/s", "x plain", "TTFT p50", "TTFT p99", "TPOT p50", "TPOT p99", "reqs", "err",
            "accept", "decide p50", "decide p99", "client cpu"]
    lines = [head]
    for r in rows:
        acc = r.get("acceptance_rate")
        lines.append([r["config"], str(r["clients"]), f"{r['tokens_per_s']:.1f}",
                      "-" if r.get("speedup_vs_plain") is None else f"{r['speedup_vs_plain']:.2f}",
                      ms(r["ttft_p50_s"]), ms(r["ttft_p99_s"]), ms(r["tpot_p50_s"]), ms(r["tpot_p99_s"]),
                      str(r["requests"]), str(r["errors"]), "-" if acc is None else f"{acc:.2f}",
                      us(r.get("decision_p50_us")), us(r.get("decision_p99_us")),
                      "-" if r["client_cpu_share"] is None else f"{r['client_cpu_share']:.0%}"])
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    out = ["  ".join(c.rjust(w) for c, w in zip(line, widths)) for line in lines]
    out.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(out) + "\n(times in ms, decision latency in µs; x plain: tokens/s over plain's at that count)"


def machine(backend: str) -> dict[str, Any]:
    """Read after the runs, so the client process touches no accelerator while servers run."""
    try:
        info = machine_info(get_backend(None if backend == "auto" else backend))
        return {**info, "label": machine_label(info)}
    except Exception as exc:  # the figures stand without it
        return {"label": f"{platform.node()} ({platform.processor() or platform.machine()})", "error": str(exc)}


# -- the run ----------------------------------------------------------------------------------------------

def run_bench_server(args: argparse.Namespace) -> int:
    """One run with ``hyspec bench-server``'s checked options; 0 when every configuration ran without errors."""
    log_dir = Path(args.log_dir) if args.log_dir else Path(tempfile.mkdtemp(prefix="hyspec-bench-server-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    rules_path = None
    if args.tiny:
        model, drafters, rules_path = tiny_models(log_dir)
    else:
        model = args.model or str(default_model())
        drafters = embedded_drafters() if args.model is None else {}
    configs = default_configs(args, drafters, rules_path)
    prompts, prompt_summary = build_prompts(args, model)
    each = f"{args.duration:g} s each" if args.rounds == 1 else f"{args.rounds} alternating rounds of {args.duration:g} s"
    print(f"hyspec bench-server: {model}; configs {', '.join(configs)}; clients {args.clients}; {each}; "
          f"logs in {log_dir}", file=sys.stderr)

    rows: list[dict[str, Any]] = []
    outputs: dict[str, dict[int, list[int]]] = {}
    failures: dict[str, str] = {}
    if args.rounds > 1:
        try:
            rows, outputs = run_interleaved(configs, args, model, prompts, log_dir)
        except (RuntimeError, TimeoutError) as exc:
            failures["interleaved"] = str(exc)
            print(f"hyspec bench-server: failed: {exc}", file=sys.stderr)
    for name, spec_config in configs.items() if args.rounds == 1 else ():
        try:
            config_rows, outputs[name] = run_config(name, spec_config, args, model, prompts, log_dir)
            rows += config_rows
        except (RuntimeError, TimeoutError) as exc:
            failures[name] = str(exc)
            print(f"hyspec bench-server: {name} failed: {exc}", file=sys.stderr)
    speedups(rows)
    identity = {}
    if PLAIN in outputs:
        for name, outs in outputs.items():
            if name != PLAIN:
                common = [i for i in outs if i in outputs[PLAIN]]
                identity[name] = {"compared": len(common),
                                  "differing": sorted(i for i in common if outs[i] != outputs[PLAIN][i])}
    doc = {"schema": 1, "machine": machine(args.backend), "model": model, "prompts": prompt_summary,
           "settings": {k: v for k, v in vars(args).items()
                        if k not in ("json", "log_dir", "command", "verbose") and not k.startswith("_")},
           "configs": configs, "rows": rows, "goal": goal(rows), "identity_vs_plain": identity,
           "failures": failures}
    print(f"\nmachine: {doc['machine']['label']}\n{format_table(rows)}")
    if doc["goal"]:
        g = doc["goal"]
        ratios = ", ".join(f"{c}: {v:.2f}x" for c, v in g["ratios"].items())
        print(f"goal {g['goal']}: {'met' if g['met'] else 'NOT met'} ({ratios})")
    for name in {r["config"] for r in rows if r.get("decisions")}:
        chosen = {m for r in rows if r["config"] == name for m, n in r["decisions"].items() if n and m != "none"}
        if not chosen:
            print(f"WARNING: {name}: the dispatcher chose 'none' on every step (no rule names a loaded method, or "
                  "the load fallback held): this row is plain decoding through the hybrid path")
    for name, result in identity.items():
        if result["differing"]:
            print(f"WARNING: {name}: {len(result['differing'])} of {result['compared']} prompts differ from plain "
                  f"(prompt indices {result['differing'][:10]}): a near-tie on reduced precision, or a bug")
    out = Path(args.json) if args.json else log_dir / "bench_server.json"
    out.write_text(json.dumps(doc, indent=2, default=str))
    print(f"results: {out}", file=sys.stderr)
    return 1 if failures or any(r["errors"] for r in rows) else 0

