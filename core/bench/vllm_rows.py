"""The vLLM peers' rows of a ``hyspec bench`` run (hyspec.bench.vllm_peer runs the workers).

One peer at a time: its worker starts, loads its engine, runs every workload (an untimed warm-up wave, then
the timed passes) and quits before the next peer's starts, so one vLLM engine is alive at a time.  vLLM
plain goes first: its outputs are what the speculative vLLM rows are compared with, token for token, and
with ``--prefill-tokens`` it also measures the prefill figure.  A peer that cannot run here is a skipped
row saying why; a worker that fails is a failed peer row (peers never fail the run).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Sequence

from hyspec.bench import vllm_peer  # through the module: tests replace start_worker and probe
from hyspec.bench.identity import IdentityVerdict
from hyspec.bench.measure import Workload
from hyspec.bench.result import FAILED, OK, SKIPPED, VLLM, Row
from hyspec.bench.settings import BenchSettings, VLLM_PEERS
from hyspec.bench.stats import Spread

#: the order the vLLM peers run in
RUN_ORDER = ("vllm", "vllm_hyspec", *(p for p in VLLM_PEERS if p not in ("vllm", "vllm_hyspec")))
#: vLLM's max_model_len unless a prompt needs more (then the next multiple of 1024)
MAX_MODEL_LEN = 4096
#: a workload's hyspec-plain outputs and a judge of another engine's outputs against them
Agreement = Callable[[Workload, list[list[int]]], IdentityVerdict | None]


class VllmRows:
    """Every vLLM row of a run; ``tick(label)`` and ``advance(n)`` drive the bench's progress bar."""

    def __init__(self, settings: BenchSettings, bench_model: Path, workloads: list[Workload], agreement: Agreement,
                 tick: Callable[[str], None] = lambda _: None, advance: Callable[[int], None] = lambda _: None,
                 prefill_prompt: Sequence[int] | None = None, log_dir: Path | None = None,
                 checkpoint: Callable[[list[Row]], None] = lambda _: None):
        self.s, self.workloads, self.agreement = settings, workloads, agreement
        self.tick, self.advance = tick, advance
        self.prefill_prompt = prefill_prompt
        self.prefill: dict[str, Any] | None = None  # vLLM plain's prefill figure, when measured
        self.log_dir = log_dir
        self.bench_model = bench_model
        self.info: dict[str, Any] = {}
        self.checkpoint = checkpoint  # called with the rows so far after each peer (a vLLM engine loads for minutes)

    def _skip_all(self, peers: Sequence[str], reason: str) -> list[Row]:
        self.advance(len(peers) * len(self.workloads))
        return [Row(VLLM, p, w.batch_size, w.temperature, SKIPPED, reason) for p in peers for w in self.workloads]

    def run(self, peers: Sequence[str]) -> list[Row]:
        # vLLM plain first (the reference of the others), then vLLM + hyspec: a run cut short keeps those two
        peers = [p for p in RUN_ORDER if p in peers]
        if not peers:
            return []
        s = self.s
        self.tick("vLLM: checking")
        python = vllm_peer.resolve_python(s.vllm_python)
        reason, facts = vllm_peer.probe(python)
        model, model_reason = vllm_peer.model_unavailable(s.vllm_model, self.bench_model)
        reason = reason or model_reason
        if reason is not None:
            return self._skip_all(peers, reason)
        self.info = {"python": python, "model": str(model), "dtype": s.vllm_dtype, **facts}
        if self.log_dir is None:  # vLLM's own messages, kept for a row that failed to point at
            self.log_dir = vllm_peer.temp_log_dir()
        self.info["logs"] = str(self.log_dir)
        longest = max(len(p) for w in self.workloads for p in w.prompts)
        needed = max(longest + s.max_tokens, len(self.prefill_prompt) + 1 if self.prefill_prompt else 0) + 16
        # one length for every run that fits it: vLLM's compiled graphs are cached by a hash that includes
        # max_model_len, so runs of other workloads reuse them instead of compiling for minutes each
        max_model_len = max(MAX_MODEL_LEN, -(-needed // 1024) * 1024)
        setup = vllm_peer.VllmSetup(python=python, model=model, dtype=s.vllm_dtype, max_model_len=max_model_len,
                                    memory_fraction=s.vllm_memory_fraction,
                                    num_speculative_tokens=s.num_speculative_tokens, eagle3=s.vllm_eagle3,
                                    hyspec_options=s.vllm_hyspec_options, seed=s.seed, log_dir=self.log_dir)
        plain: dict[tuple[int, float], list[list[int]]] = {}
        rows: list[Row] = []
        for peer in peers:
            rows += self._peer(peer, setup, facts, plain)
            self.checkpoint(list(rows))
        return rows

    def _peer(self, peer: str, setup: vllm_peer.VllmSetup, facts: dict[str, Any],
              plain: dict[tuple[int, float], list[list[int]]]) -> list[Row]:
        spec, reason = vllm_peer.speculative_config(peer, setup, facts)
        if reason is not None:
            return self._skip_all([peer], reason)
        self.tick(f"{peer}: loading")
        worker, log = vllm_peer.start_worker(setup, peer)
        log_hint = "" if log is None else f" (log: {log.name})"
        try:
            try:
                loaded = worker.ask(vllm_peer.load_request(peer, setup, spec))
            except vllm_peer.WorkerError as exc:
                status = SKIPPED if exc.unavailable else FAILED
                self.advance(len(self.workloads))
                return [Row(VLLM, peer, w.batch_size, w.temperature, status,
                            f"vLLM did not start: {exc}{log_hint}") for w in self.workloads]
            note = (f"vLLM {loaded.get('vllm_version')} ({setup.dtype}, {setup.model.name}), loaded in "
                    f"{loaded.get('load_seconds', 0):.0f} s" + ("" if spec is None else f"; {spec}"))
            rows = [self._row(peer, worker, w, note, plain, log_hint) for w in self.workloads]
            if peer == "vllm" and self.prefill_prompt is not None:
                self._prefill(worker, log_hint)
            return rows
        finally:
            worker.close()
            if log is not None:
                log.close()

    def _row(self, peer: str, worker: vllm_peer.VllmWorker, w: Workload, note: str,
             plain: dict[tuple[int, float], list[list[int]]], log_hint: str) -> Row:
        self.tick(f"{peer} bs {w.batch_size} T {w.temperature:g}")
        try:
            m = vllm_peer.measure(worker, w, self.s.repeats, note)
            if peer == "vllm":
                plain[w.key()] = m.outputs[-1]
                identity = None
            else:
                identity = vllm_peer.identity_vs(plain.get(w.key()), m.outputs, w.temperature, "vLLM plain")
            agreement = self.agreement(w, m.outputs[0])
        except vllm_peer.WorkerError as exc:
            row = Row(VLLM, peer, w.batch_size, w.temperature, SKIPPED if exc.unavailable else FAILED,
                      f"vLLM failed: {exc}{log_hint}")
        except Exception as exc:  # the identity check's own failure: the row says so
            row = Row(VLLM, peer, w.batch_size, w.temperature, FAILED, f"{type(exc).__name__}: {exc}")
        else:
            row = Row(VLLM, peer, w.batch_size, w.temperature, OK, measurement=m, identity=identity,
                      agreement=agreement)
        self.advance(1)
        return row

    def _prefill(self, worker: vllm_peer.VllmWorker, log_hint: str) -> None:
        self.tick("vLLM plain: prefill")
        try:
            rates = vllm_peer.prefill_rates(worker, self.prefill_prompt, self.s.repeats)
        except vllm_peer.WorkerError as exc:
            self.prefill = {"engine": VLLM, "label": "vLLM", "error": f"{exc}{log_hint}"}
        else:
            self.prefill = {"engine": VLLM, "label": "vLLM", "tokens_per_s": Spread.of(rates).to_dict()}
