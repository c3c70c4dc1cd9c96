"""Probe the Ascend NPU backend without risking this process.

torch_npu is found with ``importlib.util.find_spec`` (which does not import
it) and imported only in a child process (see npu_query.py) with a timeout.
Two real failure modes are told apart from the child's stderr:

* CANN toolkit missing: ``import torch_npu`` fails with
  ``libhccl.so / libascendcl.so: cannot open shared object file``;
* torch's device-backend autoload (entry point group ``torch.backends``)
  loads torch_npu during ``import torch`` and ``import torch`` itself fails
  with ``Failed to load the backend extension: torch_npu`` - fixed for torch by
  ``TORCH_DEVICE_BACKEND_AUTOLOAD=0``.

Nothing here imports torch, so the CLI can run this before torch is imported.
"""
from __future__ import annotations

import importlib.util
import json
import os
import re
import site
import subprocess
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hyspec.backends.npu_query import CHILD_CODE, MARK, query_devices, query_ops
from hyspec.backends.installed import dist_version
from hyspec.backends.records import NpuCapabilities, NpuDevice

DEFAULT_TIMEOUT_S = 120.0

# (first, last, family): SoC version numbers of c10_npu::SocVersion
SOC_FAMILIES = (
    (100, 104, "910"),
    (200, 205, "310P"),
    (220, 225, "910B/A2"),
    (240, 243, "310B"),
    (250, 255, "910_93/A3"),
    (260, 260, "A5/950"),
)

_CANN_LIBS = r"lib(?:hccl|ascendcl|acl_op_compiler|ge_runner|graph|runtime|opapi|ascend_protobuf|c_sec|tiling_api)\.so"
_DRIVER_LIBS = r"lib(?:ascend_hal|drvdsmi_host|dcmi)\.so"
_MISSING_LIB = r"[\w.]*: cannot open shared object file"
_AUTOLOAD_MARK = "Failed to load the backend extension"
_EXCEPTION_LINE = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt)): (.*)$", re.MULTILINE)

HINT_INSTALL = ("install the Ascend driver and CANN toolkit, then pip install 'hyspec[npu]' "
                "with the torch-npu release built for your torch (https://github.com/Ascend/pytorch)")
HINT_CANN = ("install the CANN toolkit and load it in this shell before starting hyspec: "
             "source /usr/local/Ascend/ascend-toolkit/set_env.sh (CANN >= 8.5: /usr/local/Ascend/cann/set_env.sh)")
HINT_DRIVER = ("install the Ascend NPU driver and firmware (check with npu-smi info) "
               "and add its lib64 to LD_LIBRARY_PATH")
HINT_AUTOLOAD = ("export TORCH_DEVICE_BACKEND_AUTOLOAD=0 so that `import torch` stops auto-loading torch_npu; "
                 "to use the NPU, fix torch_npu's own import too")


def soc_family(soc_version: int | None) -> str | None:
    """The Ascend family of a SoC version number (e.g. 223 -> "910B/A2"), None if unknown."""
    if soc_version is None:
        return None
    for first, last, family in SOC_FAMILIES:
        if first <= soc_version <= last:
            return family
    return None


def release_of(version: str | None) -> str | None:
    """"2.5.1.post2" -> "2.5.1"; "2.13.0+cpu" -> "2.13.0" (torch_npu's version embeds torch's)."""
    match = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", version or "")
    if match is None:
        return None
    return ".".join(g for g in match.groups(default="0"))


def read_cann_version(env: dict[str, str] | None = None) -> tuple[str | None, str | None]:
    """(CANN version, the toolkit folder it came from) read from the toolkit's install files."""
    env = os.environ if env is None else env
    homes = [env.get("ASCEND_HOME_PATH"), env.get("ASCEND_TOOLKIT_HOME"),
             "/usr/local/Ascend/ascend-toolkit/latest", "/usr/local/Ascend/cann",
             str(Path.home() / "Ascend" / "ascend-toolkit" / "latest")]
    for home in filter(None, homes):
        root = Path(home)
        candidates = [*sorted(root.glob("*-linux/ascend_toolkit_install.info")), root / "ascend_toolkit_install.info",
                      root / "version.cfg", root / "compiler" / "version.info", root / "runtime" / "version.info"]
        for path in candidates:
            try:
                text = path.read_text(errors="replace")
            except OSError:
                continue
            match = re.search(r"^\s*\w*version\s*=\s*\[?([0-9][\w.\-]*)", text, re.MULTILINE | re.IGNORECASE)
            if match:
                return match.group(1), str(root)
    return None, None


@dataclass(frozen=True)
class Failure:
    mode: str
    reason: str
    hint: str
    import_error: str | None


def classify_failure(stage: str | None, stderr: str, returncode: int | None) -> Failure:
    """Name the failure from the stage the child reached and the traceback it printed."""
    exceptions = _EXCEPTION_LINE.findall(stderr)
    last = f"{exceptions[-1][0]}: {exceptions[-1][1]}" if exceptions else None
    root = f"{exceptions[0][0]}: {exceptions[0][1]}" if exceptions else None  # chained causes print first
    cann = re.search(_CANN_LIBS + r"[\w.]*: cannot open shared object file", stderr)
    driver = re.search(_DRIVER_LIBS + r"[\w.]*: cannot open shared object file", stderr)
    missing_lib = cann or driver or re.search(_MISSING_LIB, stderr)
    if _AUTOLOAD_MARK in stderr or (stage == "import torch" and "TORCH_DEVICE_BACKEND_AUTOLOAD" in stderr):
        cause = f" ({missing_lib.group(0)})" if missing_lib else (f" ({root})" if root and root != last else "")
        then = HINT_CANN if cann else HINT_DRIVER if driver else "run python -c 'import torch_npu' to see its error"
        return Failure("autoload_broken",
                       f"`import torch` fails: torch's device-backend autoload loads torch_npu, whose import "
                       f"fails{cause}", f"{HINT_AUTOLOAD}: {then}", last)
    if stage == "import torch":
        return Failure("import_failed", f"`import torch` fails in a fresh interpreter: {last or 'no error text'}",
                       "reinstall torch (pip install torch==<version>)", last)
    if stage == "import torch_npu" or stage is None:
        if cann:
            return Failure("cann_missing", f"CANN toolkit not found: `import torch_npu` fails with {last}",
                           HINT_CANN, last)
        if driver:
            return Failure("driver_missing", f"Ascend driver not found: `import torch_npu` fails with {last}",
                           HINT_DRIVER, last)
        if stage is None and returncode is not None and returncode < 0:
            return Failure("import_failed", f"the torch_npu import probe crashed with signal {-returncode}",
                           "run python -c 'import torch, torch_npu' to see where it crashes", last)
        return Failure("import_failed", f"`import torch_npu` fails: {last or 'no error text'}",
                       "run python -c 'import torch_npu' to see the full error; check that torch-npu "
                       "matches your torch", last)
    return Failure("query_failed", f"torch_npu imports but querying devices fails: {last or 'no error text'}",
                   "check npu-smi info and ASCEND_RT_VISIBLE_DEVICES", last)


def _child_env(package_dir: str | None) -> dict[str, str]:
    """The child's environment: ours, with the found torch_npu's folder on its path if not already."""
    env = dict(os.environ)
    if package_dir is None:
        return env
    known = {*site.getsitepackages(), site.getusersitepackages(), *env.get("PYTHONPATH", "").split(os.pathsep)}
    if package_dir not in known:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_dir, env.get("PYTHONPATH")]))
    return env


def run_child(package_dir: str | None, timeout_s: float) -> tuple[dict[str, Any] | None, str, int | None]:
    """(parsed result line or None, stderr, return code or None on timeout)."""
    try:
        proc = subprocess.run([sys.executable, "-c", CHILD_CODE], capture_output=True, text=True,
                              timeout=timeout_s, env=_child_env(package_dir))
    except subprocess.TimeoutExpired as exc:
        stderr = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else (exc.stderr or "")
        return None, stderr, None
    result = None
    for line in proc.stdout.splitlines():
        if line.startswith(MARK):
            result = json.loads(line[len(MARK):])
    return result, proc.stderr, proc.returncode


def _query_in_process(torch_npu: Any) -> tuple[dict[str, Any], str, int]:
    """run_child's answer, from a torch_npu this process has already imported."""
    import torch

    found: dict[str, Any] = {"stage": "query devices", "torch_version": torch.__version__,
                             "torch_npu_version": getattr(torch_npu, "__version__", None)}
    try:
        found.update(query_devices(torch_npu))
    except Exception:  # a device query that fails is reported, as it is from the child
        return found, traceback.format_exc(), 3
    found["ops"] = query_ops() if found.get("device_count") else None
    found["stage"] = "done"
    return found, "", 0


#: HYSPEC_NPU_EMULATE=<op-plugin branch>[:no-atb] stands a pure-torch torch_npu of that release in for the
#: real one (hyspec.npu_ops.emulation): the NPU backend then runs on the host, for tests and dry runs
EMULATE_ENV = "HYSPEC_NPU_EMULATE"


def emulation_request(env: dict[str, str] | None = None) -> tuple[str, bool] | None:
    """(branch, ATB loaded) asked for by HYSPEC_NPU_EMULATE, or None."""
    value = (os.environ if env is None else env).get(EMULATE_ENV, "").strip()
    if not value:
        return None
    branch, _, flag = value.partition(":")
    if flag not in ("", "no-atb"):
        raise ValueError(f"{EMULATE_ENV}={value!r}: the only flag is ':no-atb' (e.g. 26.1.0:no-atb)")
    return branch, flag != "no-atb"


def _probe_emulated(branch: str, atb_loaded: bool) -> NpuCapabilities:
    """The probe of an emulated stack: torch_npu is hyspec's stand-in, installed in this process."""
    from hyspec.npu_ops.emulation import install_emulation

    module = install_emulation(branch, atb_loaded)
    found, stderr, returncode = _query_in_process(module)
    release = found.get("ops", {}).get("op_plugin", branch)
    devices = tuple(NpuDevice(**d) for d in found.get("devices", ()))
    return NpuCapabilities(
        available=returncode == 0, reason=None if returncode == 0 else f"emulated torch_npu failed: {stderr}",
        hint=f"EMULATED ({EMULATE_ENV}={branch}): {release}; computes on the host, proves nothing about kernels",
        installed=True, failure_mode=None if returncode == 0 else "query_failed", import_error=None,
        torch_version=found.get("torch_version"), torch_npu_version=module.__version__,
        torch_npu_built_for_torch=release_of(module.__version__), version_mismatch=None,
        device_count=int(found.get("device_count", 0)), devices=devices, soc_name=devices[0].name if devices else None,
        soc_version=found.get("soc_version"), soc_family=soc_family(found.get("soc_version")),
        cann_version=module.HYSPEC_CANN, cann_home=None, emulated=branch, op_plan=found.get("ops"))


def probe_npu(timeout_s: float = DEFAULT_TIMEOUT_S) -> NpuCapabilities:
    emulation = emulation_request()
    if emulation is not None:
        return _probe_emulated(*emulation)
    cann_version, cann_home = read_cann_version()
    spec = importlib.util.find_spec("torch_npu")
    torch_version = dist_version("torch")
    base = dict(torch_version=torch_version, torch_npu_version=None, torch_npu_built_for_torch=None,
                version_mismatch=None, device_count=0, devices=(), soc_name=None, soc_version=None,
                soc_family=None, cann_version=cann_version, cann_home=cann_home, import_error=None)
    if spec is None:
        return NpuCapabilities(available=False, reason="torch_npu is not installed", hint=HINT_INSTALL,
                               installed=False, failure_mode="not_installed", **base)
    base["torch_npu_version"] = dist_version("torch_npu")
    if "torch_npu" in sys.modules:  # already imported here without harm: ask it directly
        found, stderr, returncode = _query_in_process(sys.modules["torch_npu"])
    else:
        locations = list(spec.submodule_search_locations or [])
        package_dir = str(Path(locations[0] if locations else spec.origin).parent)
        found, stderr, returncode = run_child(package_dir, timeout_s)
    found = found or {}
    base["torch_version"] = found.get("torch_version") or torch_version
    base["torch_npu_version"] = found.get("torch_npu_version") or base["torch_npu_version"]
    built_for, torch_release = release_of(base["torch_npu_version"]), release_of(base["torch_version"])
    base["torch_npu_built_for_torch"] = built_for
    if built_for and torch_release:
        base["version_mismatch"] = built_for != torch_release
    mismatch_note = (f"torch_npu {base['torch_npu_version']} is built for torch {built_for}, "
                     f"but torch is {base['torch_version']}: pip install torch=={built_for} "
                     f"(or the torch-npu release for torch {torch_release})") if base["version_mismatch"] else None

    if returncode is None:
        return NpuCapabilities(available=False, reason=f"the torch_npu import probe did not finish within "
                               f"{timeout_s:g} s", hint="run python -c 'import torch, torch_npu' by hand to see "
                               "where it hangs (a stuck driver or a busy device)", installed=True,
                               failure_mode="timeout", **base)
    if found.get("stage") != "done":
        failure = classify_failure(found.get("stage"), stderr, returncode)
        base["import_error"] = failure.import_error
        hint = f"{failure.hint}; {mismatch_note}" if mismatch_note else failure.hint
        return NpuCapabilities(available=False, reason=failure.reason, hint=hint, installed=True,
                               failure_mode=failure.mode, **base)
    devices = tuple(NpuDevice(**d) for d in found.get("devices", ()))
    soc_version = found.get("soc_version")
    base.update(device_count=int(found.get("device_count", 0)), devices=devices,
                soc_name=devices[0].name if devices else None, soc_version=soc_version,
                soc_family=soc_family(soc_version))
    if not devices:
        visible = os.environ.get("ASCEND_RT_VISIBLE_DEVICES")
        where = f" (ASCEND_RT_VISIBLE_DEVICES={visible!r})" if visible is not None else ""
        return NpuCapabilities(available=False, reason=f"torch_npu imports but sees no NPU{where}",
                               hint="check npu-smi info and ASCEND_RT_VISIBLE_DEVICES", installed=True,
                               failure_mode="no_devices", **base)
    return NpuCapabilities(available=True, reason=None, hint=mismatch_note, installed=True, failure_mode=None,
                           op_plan=found.get("ops"), **base)
