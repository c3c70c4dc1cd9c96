"""What scripts/gpu_first_contact.py and scripts/npu_first_contact.py share: one step = one child process.

A step runs with its own timeout; a hang, a crash or a missing tool (npu-smi, nvidia-smi) is recorded in
the step and the next one runs.  The child's JSON answer (its whole stdout, else its last line) is kept.
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

TAIL = 4000  # characters of stdout / stderr kept per step


def parse_json(out: str):
    """The JSON a child printed: its whole stdout (``--json`` reports), else its last line; None if neither."""
    for text in (out, out.splitlines()[-1] if out else ""):
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            continue
    return None


def run_step(name: str, cmd: list[str], timeout_s: float, env: dict[str, str], cwd: Path,
             expect_json: bool = True) -> dict:
    started = time.time()
    step: dict = {"step": name, "timeout_s": timeout_s,
                  "command": " ".join(cmd) if cmd[0] != sys.executable else f"python: {name}"}
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env, cwd=cwd)
        step["returncode"] = proc.returncode
        out = proc.stdout.strip()
        result = parse_json(out) if expect_json else None
        if result is not None:
            step["result"] = result
        else:
            step["stdout_tail"] = out[-TAIL:]
        if proc.returncode != 0 or not expect_json:
            step["stderr_tail"] = proc.stderr[-TAIL:]
    except subprocess.TimeoutExpired as exc:
        err = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else (exc.stderr or "")
        step.update(returncode=None, timed_out=True, stderr_tail=err[-TAIL:])
    except FileNotFoundError as exc:
        step.update(returncode=None, skipped=str(exc))
    step["seconds"] = round(time.time() - started, 1)
    return step
