"""vLLM's CPU build as a peer in ``hyspec bench``: the engine hyspec's users serve with.

vLLM pins its own torch, so it lives in a venv of its own (``scripts/vllm_venv.sh`` builds one, with hyspec
installed into it for hyspec's proposer).  ``--vllm-python PATH`` (or ``$HYSPEC_VLLM_PYTHON``) names that
venv's Python; each vLLM row runs in a worker process of that Python (``PATH -m hyspec.bench.vllm_worker``,
JSON lines over stdin/stdout), one engine per worker, one worker alive at a time, after hyspec's own rows.

Rows (``VLLM_PEERS``), on the same prompt token ids, token count and waves as hyspec's rows, EOS ignored:

* ``vllm``: plain decoding;
* ``vllm_ngram``: vLLM's ngram method, ``num_speculative_tokens`` = hyspec's (its own n-gram bounds);
* ``vllm_suffix``: vLLM's suffix method (needs ``arctic-inference`` in the vLLM venv; its own defaults);
* ``vllm_eagle3``: vLLM's eagle3 method with the EAGLE-3 head ``hyspec export-drafter eagle3`` writes
  (``--vllm-eagle3 DIR``);
* ``vllm_hyspec``: vLLM + hyspec's proposer (``custom_class`` ``hyspec.vllm.HyspecProposer``), its options
  (``--vllm-hyspec-options``, default the hybrid) passed through ``HYSPEC_VLLM_CONFIG``.

vLLM reads a Hugging Face directory: ``--vllm-model DIR`` (``hyspec export-hf DIR`` writes the default GGUF as
one, dequantized); without it, the bench's model when it is such a directory.  Weights and dtype are then
vLLM's: the README says which.  Each speculative row is compared token for token with vLLM plain's
outputs (its ``identity``); every row with hyspec plain's (``agreement``, for information: the weights may
differ).  Acceptance comes from vLLM's own ``vllm:spec_decode_*`` counters over the timed passes.
"""
from __future__ import annotations

import json
import os
import subprocess
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Mapping, Sequence

from hyspec.bench.identity import IDENTICAL, MISMATCH, NOT_APPLICABLE, IdentityVerdict
from hyspec.bench.machine import MemoryPeak
from hyspec.bench.measure import WARMUP_TOKENS, Measurement, Workload
from hyspec.bench.peers import PeerUnavailable
from hyspec.bench.settings import VLLM_PEERS
from hyspec.bench.stats import Spread
from hyspec.bench.vllm_server import HYSPEC_METHOD, PYTHON_ENV
from hyspec.numerics import first_divergence

INSTALL_HINT = ("VLLM_PY=$(bash scripts/vllm_venv.sh) builds vLLM's CPU build in a venv of its own; then pass "
                "--vllm-python $VLLM_PY")
SUFFIX_HINT = "vLLM's suffix method needs arctic-inference: {python} -m pip install arctic-inference"
WORKER_MODULE = "hyspec.bench.vllm_worker"
#: the vLLM-side facts a row's skip reason depends on, probed once per run
_PROBE = """import json, importlib.util as u
import vllm
out = {"version": vllm.__version__, "arctic_inference": u.find_spec("arctic_inference") is not None,
       "hyspec_vllm": u.find_spec("hyspec.vllm") is not None,
       "custom_class": u.find_spec("vllm.v1.spec_decode.custom_class_proposer") is not None}
print(json.dumps(out))"""


def resolve_python(explicit: str | None) -> str | None:
    """``--vllm-python``, else ``$HYSPEC_VLLM_PYTHON``, else None (vLLM is never in hyspec's own venv)."""
    return explicit or os.environ.get(PYTHON_ENV) or None


def probe(python: str | None, timeout_s: float = 300.0) -> tuple[str | None, dict[str, Any]]:
    """(None, facts) when ``python`` imports vLLM, else (the reason, {})."""
    if python is None:
        return f"no vLLM Python given: {INSTALL_HINT} (or set ${PYTHON_ENV})", {}
    if not Path(python).exists():
        return f"no Python at {python} ({INSTALL_HINT})", {}
    try:
        done = subprocess.run([python, "-c", _PROBE], capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{python} cannot be run: {type(exc).__name__}: {exc}", {}
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["(no message)"])[-1]
        if "No module named 'vllm'" in last:
            return f"vLLM is not installed for {python} ({INSTALL_HINT})", {}
        return f"vllm fails to import in {python}: {last}", {}
    return None, json.loads(done.stdout.strip().splitlines()[-1])


@dataclass(frozen=True)
class VllmSetup:
    """What every vLLM row shares: the interpreter, the model directory and vLLM's engine arguments."""

    python: str
    model: Path
    dtype: str
    max_model_len: int
    memory_fraction: float
    num_speculative_tokens: int
    eagle3: Path | None
    hyspec_options: Mapping[str, Any]
    seed: int = 0
    log_dir: Path | None = None


def model_unavailable(model: Path | None, bench_model: Path) -> tuple[Path | None, str | None]:
    """vLLM's model directory, or why there is none."""
    if model is None:
        if (bench_model / "config.json").is_file():
            return bench_model, None
        return None, (f"vLLM reads a Hugging Face directory and {bench_model.name} is not one: write it with "
                      f"hyspec export-hf DIR{'' if bench_model.suffix != '.gguf' else f' --model {bench_model}'} "
                      "and pass --vllm-model DIR")
    if not (model / "config.json").is_file():
        return None, f"--vllm-model {model}: no config.json there (write one with hyspec export-hf DIR)"
    return model, None


def speculative_config(peer: str, setup: VllmSetup, facts: Mapping[str, Any]) -> tuple[dict | None, str | None]:
    """(vLLM's speculative_config for ``peer``, None) or (None, why the row cannot run)."""
    k = setup.num_speculative_tokens
    if peer == "vllm":
        return None, None
    if peer == "vllm_ngram":
        return {"method": "ngram", "num_speculative_tokens": k}, None
    if peer == "vllm_suffix":
        if not facts.get("arctic_inference"):
            return None, SUFFIX_HINT.format(python=setup.python)
        return {"method": "suffix"}, None  # vLLM's defaults: drafts sized by the tree depth (24), as hyspec's suffix
    if peer == "vllm_eagle3":
        if setup.eagle3 is None:
            return None, ("no EAGLE-3 head for vLLM: write one with hyspec export-drafter eagle3 DIR --target "
                          "MODEL_DIR and pass --vllm-eagle3 DIR")
        if not (setup.eagle3 / "config.json").is_file():
            return None, f"--vllm-eagle3 {setup.eagle3}: no config.json there"
        return {"method": "eagle3", "model": str(setup.eagle3), "num_speculative_tokens": k}, None
    if peer == "vllm_hyspec":
        if not facts.get("custom_class"):
            return None, f"vLLM {facts.get('version')} has no custom_class speculative method (vLLM >= 0.32 has)"
        if not facts.get("hyspec_vllm"):
            return None, f"hyspec is not installed for {setup.python}: {setup.python} -m pip install -e . --no-deps"
        return {"method": "custom_class", "model": HYSPEC_METHOD, "num_speculative_tokens": k}, None
    raise ValueError(f"unknown vLLM peer {peer!r}; one of {', '.join(VLLM_PEERS)}")


class WorkerError(RuntimeError):
    """The worker answered ``"ok": false`` or died; ``unavailable``: vLLM cannot run this configuration here."""

    def __init__(self, message: str, unavailable: bool = False):
        super().__init__(message)
        self.unavailable = unavailable


class VllmWorker:
    """One worker process (one engine): ``ask`` sends a request line and reads its answer line."""

    def __init__(self, command: Sequence[str], log: IO[str] | int = subprocess.DEVNULL,
                 env: Mapping[str, str] | None = None, timeout_s: float = 3600.0):
        self.timeout_s = timeout_s
        self.process = subprocess.Popen(list(command), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                                        text=True, env=None if env is None else dict(env), start_new_session=True)

    def ask(self, request: Mapping[str, Any]) -> dict[str, Any]:
        assert self.process.stdin is not None and self.process.stdout is not None
        try:
            self.process.stdin.write(json.dumps(request) + "\n")
            self.process.stdin.flush()
        except OSError as exc:
            raise WorkerError(f"the vLLM worker is gone ({exc}){self._status()}") from None
        line = self._readline()
        if line is None:
            raise WorkerError(f"the vLLM worker did not answer {request.get('op')!r} within {self.timeout_s:g} s "
                              "(killed)")
        if not line:
            try:  # its exit status, for the message
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                pass
            raise WorkerError(f"the vLLM worker exited without answering {request.get('op')!r}{self._status()}")
        answer = json.loads(line)
        if not answer.get("ok"):
            raise WorkerError(answer.get("error", "no error message"), answer.get("kind") == "unavailable")
        return answer

    def _readline(self) -> str | None:
        """One answer line ("" at the end of the stream), or None after ``timeout_s`` (the worker is then killed)."""
        box: list[str] = []
        reader = threading.Thread(target=lambda: box.append(self.process.stdout.readline()), daemon=True)
        reader.start()
        reader.join(self.timeout_s)
        if reader.is_alive():
            self.kill()
            reader.join(10)
            return None
        return box[0] if box else ""

    def _status(self) -> str:
        code = self.process.poll()
        return "" if code is None else f" (exit status {code})"

    def close(self) -> None:
        """``quit``, then a kill if it lingers; vLLM's engine process goes with the worker's session."""
        if self.process.poll() is None:
            try:
                self.ask({"op": "quit"})
                self.process.wait(60)
            except (WorkerError, subprocess.TimeoutExpired, OSError, ValueError):
                self.kill()
        for stream in (self.process.stdin, self.process.stdout):
            if stream is not None:
                stream.close()

    def kill(self) -> None:
        try:
            os.killpg(self.process.pid, 9)
        except (ProcessLookupError, PermissionError):
            pass
        self.process.wait()


def start_worker(setup: VllmSetup, peer: str) -> tuple[VllmWorker, IO[str] | None]:
    env = dict(os.environ, VLLM_ALLOW_INSECURE_SERIALIZATION="1")  # the worker's one callable: worker-local
    log = None
    if setup.log_dir is not None:
        setup.log_dir.mkdir(parents=True, exist_ok=True)
        log = open(setup.log_dir / f"{peer}.log", "w", encoding="utf-8")
    return VllmWorker([setup.python, "-m", WORKER_MODULE], subprocess.DEVNULL if log is None else log, env), log


def load_request(peer: str, setup: VllmSetup, spec: dict | None) -> dict[str, Any]:
    return {"op": "load", "model": str(setup.model), "dtype": setup.dtype, "max_model_len": setup.max_model_len,
            "memory_fraction": setup.memory_fraction, "seed": setup.seed, "speculative_config": spec,
            "hyspec_options": dict(setup.hyspec_options) if peer == "vllm_hyspec" else None,
            "enable_prefix_caching": True}


def pass_request(workload: Workload, max_tokens: int) -> dict[str, Any]:
    waves = [[list(map(int, workload.prompts[i])) for i in wave] for wave in workload.waves]
    seeds = None if not workload.temperature else [workload.request_seed(i) for i in range(len(workload.prompts))]
    return {"op": "pass", "waves": waves, "max_tokens": max_tokens, "temperature": workload.temperature,
            "seeds": seeds}


def acceptance(spec_totals: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The timed passes' counters together, in the shape of hyspec's rows (measure.acceptance_from_totals)."""
    if not spec_totals:
        return None
    drafts = sum(s["drafts"] for s in spec_totals)
    draft_tokens = sum(s["draft_tokens"] for s in spec_totals)
    accepted = sum(s["accepted_tokens"] for s in spec_totals)
    width = max(len(s["accepted_per_position"]) for s in spec_totals)
    per_pos = [sum((list(s["accepted_per_position"]) + [0] * width)[j] for s in spec_totals) for j in range(width)]
    return {"drafts": drafts, "draft_tokens": draft_tokens, "accepted_tokens": accepted,
            "acceptance_rate": accepted / draft_tokens if draft_tokens else None,
            "mean_acceptance_length": 1.0 + accepted / drafts if drafts else None,
            "per_position": [p / drafts if drafts else 0.0 for p in per_pos], "source": "vLLM's spec_decode counters"}


def measure(worker: VllmWorker, workload: Workload, repeats: int, note: str) -> Measurement:
    """An untimed warm-up wave, then ``repeats`` timed passes, as hyspec's rows are measured."""
    warm = Workload(workload.prompts[:workload.batch_size], workload.batch_size, workload.temperature,
                    workload.max_tokens, workload.seed)
    worker.ask(pass_request(warm, min(WARMUP_TOKENS, workload.max_tokens)))
    rates, ttfts, outputs, specs = [], [], [], []
    generated, rss = 0, None
    for _ in range(repeats):
        answer = worker.ask(pass_request(workload, workload.max_tokens))
        generated = sum(len(t) for t in answer["outputs"])
        rates.append(generated / answer["seconds"])
        ttfts += answer["ttfts"]
        outputs.append(answer["outputs"])
        if answer.get("spec") is not None:
            specs.append(answer["spec"])
        rss = answer.get("max_rss_bytes")
    peak = MemoryPeak(rss, None, "VmHWM of the vLLM worker process (vLLM's engine process not included)")
    return Measurement(tokens_per_s=Spread.of(rates), generated_tokens=generated,
                       ttft_s=Spread.of(ttfts) if ttfts else None, outputs=outputs, peak=peak,
                       acceptance=acceptance(specs), notes=[note])


def identity_vs(reference: Sequence[Sequence[int]] | None, outputs: Sequence[Sequence[Sequence[int]]],
                temperature: float, what: str) -> IdentityVerdict | None:
    """Every repeat's outputs against ``reference`` token for token (``what`` names it); None without one."""
    if temperature:
        return IdentityVerdict(NOT_APPLICABLE)
    if reference is None:
        return None
    verdict = IdentityVerdict(IDENTICAL, sequences=len(reference))
    for number, (exp, act) in enumerate(zip(reference, outputs[-1] if outputs else [])):
        index = first_divergence(exp, act)
        if index is not None:
            verdict.mismatches += 1
            if len(verdict.details) < 5:
                verdict.details.append(f"sequence {number}: differs from {what} at output token {index}")
    if any(list(map(list, out)) != list(map(list, outputs[-1])) for out in outputs):
        verdict.mismatches += 1
        verdict.details.append("the repeats' outputs differ from each other")
    verdict.status = MISMATCH if verdict.mismatches else IDENTICAL
    return verdict


def prefill_rates(worker: VllmWorker, prompt: Sequence[int], repeats: int) -> list[float]:
    """Prompt tokens per second of ``prompt`` prefilled alone (one token generated), after one untimed run."""
    answer = worker.ask({"op": "prefill", "prompts": [list(map(int, prompt))] * (repeats + 1)})
    return [len(prompt) / s for s in answer["seconds"][1:]]


def check_hyspec_options(options: Mapping[str, Any]) -> None:
    """``--vllm-hyspec-options`` as hyspec's proposer will read them in vLLM's engine process: a bad key or value
    is a ConfigError now, not a vllm_hyspec row failing after the rest of the run."""
    from hyspec.errors import ConfigError
    from hyspec.vllm.options import load_options

    with tempfile.NamedTemporaryFile("w", suffix=".json", encoding="utf-8") as f:
        json.dump(dict(options), f)
        f.flush()
        try:
            load_options(f.name)
        except ConfigError as exc:
            raise ConfigError("--vllm-hyspec-options", str(exc).replace(f.name, "the options")) from None


def temp_log_dir() -> Path:
    return Path(tempfile.mkdtemp(prefix="hyspec-bench-vllm-"))


__all__ = ["INSTALL_HINT", "VLLM_PEERS", "VllmSetup", "VllmWorker", "WorkerError", "acceptance", "check_hyspec_options",
           "identity_vs",
           "load_request", "measure", "model_unavailable", "pass_request", "prefill_rates", "probe",
           "resolve_python", "speculative_config", "start_worker"]
