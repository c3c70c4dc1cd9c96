"""JSON-schema output through the official openai client against `hyspec serve`: valid on every prompt, with
suffix speculation on, and its speed beside plain constrained decoding.

Starts `hyspec serve` (the default model, SmolLM2-135M-Instruct) twice, one after the other: plain decoding,
then `--speculative-config '{"method": "suffix"}'`.  Each sends the same chat prompts with OpenAI's
`response_format` json_schema at temperature 0 (sequentially, batch 1), validates every answer against the
schema with the jsonschema package, checks that both servers answered with the same tokens (the lossless
contract), and records the wall time and tokens per second of each.  Each configuration is run --rounds
times, alternating, and the medians reported.

    .venv/bin/python docs/results/2026-12-06/structured-outputs/run.py --out results.json [--prompts 20]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import jsonschema
from openai import OpenAI

from hyspec.bench.serve_process import free_port, wait_until_healthy

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "country": {"type": "string", "maxLength": 40},
        "population_millions": {"type": "integer", "minimum": 0, "maximum": 5000},
        "famous_for": {"type": "array", "items": {"type": "string", "maxLength": 40}, "maxItems": 3},
    },
    "required": ["name", "country", "population_millions", "famous_for"],
    "additionalProperties": False,
}
CITIES = ["Paris", "Tokyo", "Cairo", "Lima", "Oslo", "Nairobi", "Toronto", "Mumbai", "Sydney", "Berlin",
          "Madrid", "Seoul", "Istanbul", "Mexico City", "Buenos Aires", "Rome", "Bangkok", "Lagos", "Vienna",
          "Hanoi", "Dublin", "Athens", "Lisbon", "Prague"]
MAX_TOKENS = 160
SERVERS = {"plain": None, "suffix": {"method": "suffix"}}


def prompts(count: int) -> list[str]:
    return [f"Describe the city of {city} as a JSON object with its name, country, population in millions "
            f"and up to three things it is famous for." for city in CITIES[:count]]


def start_server(spec: dict | None, log: Path, args: argparse.Namespace) -> tuple[subprocess.Popen, str]:
    port = free_port()
    cmd = [str(Path(sys.executable).with_name("hyspec")), "serve", "--port", str(port), "--host", "127.0.0.1"]
    if spec is not None:
        cmd += ["--speculative-config", json.dumps(spec)]
    if args.kv_cache_bytes:
        cmd += ["--kv-cache-bytes", args.kv_cache_bytes]
    env = dict(os.environ)
    if args.threads:
        # torch's and hyspec's C kernels' OpenMP pool: on a machine with more runnable jobs than cores a
        # 2-thread pool spends its time at barriers (a 64x576 matmul took 110 ms with 2 threads, 8 ms with 1)
        env["OMP_NUM_THREADS"] = str(args.threads)
    handle = log.open("w")
    proc = subprocess.Popen(cmd, stdout=handle, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_healthy(url, proc, timeout_s=900, log_tail=lambda: f" (log: {log})")
    except BaseException:
        stop_server(proc)
        raise
    return proc, url


def stop_server(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def run_prompts(url: str, texts: list[str]) -> dict:
    client = OpenAI(base_url=url + "/v1", api_key="unused")
    model = client.models.list().data[0].id
    answers, tokens, walls = [], [], []
    fmt = {"type": "json_schema", "json_schema": {"name": "city", "schema": SCHEMA, "strict": True}}
    for text in texts:
        t0 = time.perf_counter()
        out = client.chat.completions.create(model=model, messages=[{"role": "user", "content": text}],
                                             response_format=fmt, temperature=0, max_tokens=MAX_TOKENS,
                                             extra_body={"return_token_ids": True})
        walls.append(time.perf_counter() - t0)
        choice = out.choices[0]
        answers.append({"content": choice.message.content, "finish_reason": choice.finish_reason,
                        "token_ids": getattr(choice, "token_ids", None) or (choice.model_extra or {}).get("token_ids")})
        tokens.append(out.usage.completion_tokens)
    return {"answers": answers, "completion_tokens": tokens, "wall_s": walls}


def validate(answers: list[dict]) -> list[str]:
    problems = []
    for i, a in enumerate(answers):
        try:
            jsonschema.validate(json.loads(a["content"]), SCHEMA)
        except (json.JSONDecodeError, jsonschema.ValidationError) as exc:
            problems.append(f"prompt {i} ({a['finish_reason']}): {str(exc).splitlines()[0]}")
    return problems


def run_server(name: str, spec: dict | None, texts: list[str], log: Path, args: argparse.Namespace) -> dict:
    t0 = time.perf_counter()
    proc, url = start_server(spec, log, args)
    started = time.perf_counter() - t0
    try:
        return {**run_prompts(url, texts), "startup_s": started}
    finally:
        stop_server(proc)


def summarize(runs: dict[str, list[dict]], texts: list[str], args: argparse.Namespace) -> dict:
    summary = {}
    for name, rs in runs.items():
        if not rs:
            continue
        first = rs[0]
        summary[name] = {
            "invalid": validate(first["answers"]),
            "finish_reasons": sorted({a["finish_reason"] for a in first["answers"]}),
            "completion_tokens": sum(first["completion_tokens"]),
            "wall_s_per_round": [round(sum(r["wall_s"]), 2) for r in rs],
            "startup_s_per_round": [round(r["startup_s"], 1) for r in rs],
            "tokens_per_s_median": round(statistics.median(sum(r["completion_tokens"]) / sum(r["wall_s"])
                                                           for r in rs), 2),
        }
    result = {
        "what": "chat completions with response_format json_schema via the openai client, T 0, batch 1",
        "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                    "python": platform.python_version(), "note": args.note},
        "concurrent": args.concurrent, "threads": args.threads, "kv_cache_bytes": args.kv_cache_bytes,
        "prompts": len(texts), "max_tokens": MAX_TOKENS, "rounds": args.rounds,
        "schema": SCHEMA, "summary": summary,
    }
    if len(summary) == 2:
        same = [a["token_ids"] == b["token_ids"] and a["content"] == b["content"]
                for a, b in zip(runs["plain"][0]["answers"], runs["suffix"][0]["answers"])]
        result["identical_to_plain"] = f"{sum(same)}/{len(same)}"
        result["speedup_suffix_vs_plain"] = round(summary["suffix"]["tokens_per_s_median"]
                                                  / summary["plain"]["tokens_per_s_median"], 3)
    done = runs.get("suffix") or runs.get("plain")
    result["answers"] = [a["content"] for a in done[0]["answers"]] if done else []
    if args.out.exists():  # overhead.py's in-process figures live in the same file
        previous = json.loads(args.out.read_text())
        if "grammar_overhead" in previous:
            result["grammar_overhead"] = previous["grammar_overhead"]
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path(__file__).with_name("results.json"))
    ap.add_argument("--prompts", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=2, help="runs of each server (alternating, or side by side)")
    ap.add_argument("--concurrent", action="store_true",
                    help="run the two servers side by side (a loaded machine: both see the same load)")
    ap.add_argument("--threads", type=int, help="OMP_NUM_THREADS for the servers (1 on a machine shared with "
                                                "other jobs; default: the library's, every core)")
    ap.add_argument("--kv-cache-bytes", help="the servers' KV cache, e.g. 512MiB (default: from the memory "
                                             "fraction, several GiB resident each: two servers beside other "
                                             "jobs got one OOM-killed)")
    ap.add_argument("--note", default="shared with other jobs (timings noisy)", help="what the machine was doing")
    args = ap.parse_args()
    texts = prompts(args.prompts)
    runs: dict[str, list[dict]] = {name: [] for name in SERVERS}
    for round_ in range(args.rounds):
        if args.concurrent:
            with ThreadPoolExecutor(len(SERVERS)) as pool:
                futures = {name: pool.submit(run_server, name, spec, texts, args.out.with_suffix(f".{name}.log"),
                                             args)
                           for name, spec in SERVERS.items()}
                failures = []
                for name, future in futures.items():
                    try:
                        runs[name].append(future.result())
                    except Exception as exc:  # keep the other server's answers
                        failures.append(f"{name}: {exc}")
                args.out.write_text(json.dumps(summarize(runs, texts, args), indent=1) + "\n")  # partial
                if failures:
                    raise SystemExit("; ".join(failures))
        else:
            for name, spec in SERVERS.items():
                runs[name].append(run_server(name, spec, texts, args.out.with_suffix(f".{name}.log"), args))
                args.out.write_text(json.dumps(summarize(runs, texts, args), indent=1) + "\n")  # partial
    result = summarize(runs, texts, args)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k not in ("answers", "schema", "grammar_overhead")},
                     indent=1))
    if any(s["invalid"] for s in result["summary"].values()) or result.get("identical_to_plain", "").split("/")[0] \
            != str(len(texts)):
        raise SystemExit("some answers were invalid or differed from plain decoding")


if __name__ == "__main__":
    main()
