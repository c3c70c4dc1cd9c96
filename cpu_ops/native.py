"""Building hyspec's C kernels (cpu_ops/*.c) once per machine and loading them with ctypes.

``cc -O3 -march=native -fopenmp -shared`` into ``$HYSPEC_CACHE_DIR`` (default
``~/.cache/hyspec``)/kernels, keyed on the source (and the headers and kernels it includes), the compiler and this CPU's
flags: a machine builds each kernel once (under a second), and a cache shared
between machines never hands one CPU another's build.  The libraries use
OpenMP; loaded after torch, the process's ``libgomp.so.1`` is torch's own, so
they share its thread pool (``torch.set_num_threads`` applies to them).

No compiler, or a failed build: :func:`load` returns None with the reason
logged once, and the caller keeps its torch path.  ``HYSPEC_NATIVE=0`` turns
every kernel off (``HYSPEC_QGEMM=0`` only the block matmul, for comparisons).
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

log = logging.getLogger(__name__)

HERE = Path(__file__).parent


def cache_dir() -> Path:
    root = os.environ.get("HYSPEC_CACHE_DIR") or os.path.join(os.environ.get("XDG_CACHE_HOME") or
                                                               os.path.expanduser("~/.cache"), "hyspec")
    return Path(root) / "kernels"


def _cpu_key() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    import platform

    return platform.machine() + platform.processor()


def _compiler() -> str | None:
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")


@functools.cache
def load(source_name: str, march: str = "native") -> ctypes.CDLL | None:
    """The built library of ``cpu_ops/<source_name>`` (None when it cannot be had here; logged once).

    ``march``: the ``-march`` to build for.  Serving always uses ``native``; tests build the other ISA
    levels this CPU can run (``x86-64``: the portable path, ``haswell``: AVX2) to check the paths an
    AVX2-only machine, or one without a vector ISA we use, would take.
    """
    stem = Path(source_name).stem
    if os.environ.get("HYSPEC_NATIVE", "1") == "0":
        log.info("hyspec %s kernel disabled by HYSPEC_NATIVE=0", stem)
        return None
    cc = _compiler()
    if cc is None:
        log.info("hyspec %s kernel unavailable: no C compiler (cc/gcc) on PATH; using torch", stem)
        return None
    source = HERE / source_name
    # what the sources #include: the headers, and the kernels a source builds on, followed through every level
    # (decoder_stack.c includes qgemm.c, which includes kquants.c)
    included: list[str] = []
    pending = [source]
    while pending:
        for name in re.findall(rb'#include "([^"]+\.c)"', pending.pop().read_bytes()):
            if name.decode() not in included:
                included.append(name.decode())
                pending.append(HERE / name.decode())
    headers = b"".join(h.read_bytes() for h in sorted(HERE.glob("*.h")) + [HERE / n for n in included])
    key = hashlib.sha256(source.read_bytes() + headers + cc.encode() + _cpu_key().encode()
                         + march.encode()).hexdigest()[:16]
    target = cache_dir() / f"{stem}-{key}.so"
    if not target.is_file():
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
                out = Path(tmp) / target.name
                done = subprocess.run([cc, "-O3", f"-march={march}", "-fopenmp", "-shared", "-fPIC", "-std=gnu11",
                                       "-o", str(out), str(source), "-lm"], capture_output=True, text=True, timeout=120)
                if done.returncode != 0:
                    log.warning("hyspec %s kernel failed to build (%s); using torch: %s", stem, cc,
                                (done.stderr.strip().splitlines() or ["no message"])[-1])
                    return None
                out.replace(target)  # atomic: a concurrent builder never loads half a file
        except (OSError, subprocess.TimeoutExpired) as exc:
            log.warning("hyspec %s kernel cannot be built: %s: %s; using torch", stem, type(exc).__name__, exc)
            return None
    try:
        lib = ctypes.CDLL(str(target))
    except OSError as exc:
        log.warning("hyspec %s kernel cannot be loaded (%s); using torch", stem, exc)
        return None
    log.info("hyspec %s kernel: %s", stem, target)
    return lib


__all__ = ["cache_dir", "load"]
