"""The NPU probe's branches, with stand-in torch_npu packages written into tmp_path.

Each stand-in raises the message the real torch_npu raises in that situation;
the probe imports it in a child process exactly as it would import the real
one.  Tests that start a child import torch there (a few seconds each).
"""
from __future__ import annotations

import importlib.machinery
import os
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest
import torch

from hyspec.backends.probe_npu import classify_failure, probe_npu, read_cann_version, release_of, soc_family

CANN_MISSING_IMPORT = "ImportError('libhccl.so: cannot open shared object file: No such file or directory')"
TORCH_RELEASE = release_of(torch.__version__)


def write_torch_npu(root: Path, init_body: str, version: str | None = None, autoload: bool = False) -> None:
    """A package ``torch_npu`` under root; with ``version`` also its dist-info (and autoload entry point)."""
    pkg = root / "torch_npu"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(textwrap.dedent(init_body))
    if version is not None:
        info = root / f"torch_npu-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: torch_npu\nVersion: {version}\n")
        if autoload:
            # what torch_npu's setup.py registers; torch/__init__.py::_import_device_backends loads it
            (info / "entry_points.txt").write_text("[torch.backends]\ntorch_npu = torch_npu:_autoload\n")


@pytest.fixture
def on_path(tmp_path, monkeypatch):
    """tmp_path on this process's sys.path (find_spec) and the autoload switch as the user would have it."""
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "torch_npu", raising=False)
    return tmp_path


def test_not_installed_is_reported_without_a_child():
    if __import__("importlib").util.find_spec("torch_npu") is not None:
        pytest.skip("a torch_npu is installed here")
    caps = probe_npu()
    assert (caps.available, caps.installed, caps.failure_mode) == (False, False, "not_installed")
    assert "torch_npu is not installed" in caps.reason and "hyspec[npu]" in caps.hint


def test_cann_missing(on_path, monkeypatch):
    monkeypatch.setenv("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")
    write_torch_npu(on_path, f"import torch\nraise {CANN_MISSING_IMPORT}\n")
    caps = probe_npu(timeout_s=120)
    assert caps.installed and not caps.available
    assert caps.failure_mode == "cann_missing", caps.reason
    assert "libhccl.so: cannot open shared object file" in caps.reason
    assert caps.import_error == "ImportError: libhccl.so: cannot open shared object file: No such file or directory"
    assert "set_env.sh" in caps.hint
    assert "torch_npu" not in sys.modules  # never imported in this process


def test_cann_missing_through_ctypes_oserror():
    # some torch_npu releases load CANN with ctypes: an OSError naming libascendcl.so
    stderr = ("Traceback (most recent call last):\n  File \"<string>\", line 1, in <module>\n"
              "OSError: libascendcl.so: cannot open shared object file: No such file or directory\n")
    failure = classify_failure("import torch_npu", stderr, 3)
    assert failure.mode == "cann_missing" and "libascendcl.so" in failure.reason


def test_autoload_breaking_import_torch(on_path, monkeypatch):
    monkeypatch.setenv("TORCH_DEVICE_BACKEND_AUTOLOAD", "1")  # torch's default
    write_torch_npu(on_path, f"raise {CANN_MISSING_IMPORT}\n\ndef _autoload():\n    pass\n",
                    version="2.5.1", autoload=True)
    caps = probe_npu(timeout_s=120)
    assert caps.failure_mode == "autoload_broken", caps.reason
    assert "`import torch` fails" in caps.reason and "libhccl.so" in caps.reason
    assert caps.hint.startswith("export TORCH_DEVICE_BACKEND_AUTOLOAD=0")
    assert "Failed to load the backend extension: torch_npu" in caps.import_error
    # the dist-info's version is read without importing: 2.5.1 is built for torch 2.5.1
    assert caps.torch_npu_version == "2.5.1" and caps.torch_npu_built_for_torch == "2.5.1"
    assert caps.version_mismatch is (TORCH_RELEASE != "2.5.1")


def test_cli_stops_with_the_autoload_fix_before_importing_torch(on_path):
    write_torch_npu(on_path, f"raise {CANN_MISSING_IMPORT}\n\ndef _autoload():\n    pass\n",
                    version="2.5.1", autoload=True)
    env = {**os.environ, "PYTHONPATH": str(on_path), "TORCH_DEVICE_BACKEND_AUTOLOAD": "1"}
    env.pop("HYSPEC_BACKEND", None)
    r = subprocess.run([sys.executable, "-m", "hyspec.cli.main", "probe"], capture_output=True, text=True,
                       env=env, timeout=300)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert "TORCH_DEVICE_BACKEND_AUTOLOAD=0" in r.stderr


SUCCESS = """\
    import types
    import torch

    __version__ = "{version}"
    _C = types.SimpleNamespace(_npu_get_soc_version=lambda: {soc})
    npu = types.SimpleNamespace(
        device_count=lambda: {count},
        get_device_name=lambda i=0: "Ascend910B3",
        get_device_properties=lambda i: types.SimpleNamespace(total_memory=64 * 2**30),
    )
"""


def test_success_reports_devices_soc_family_and_pairing(on_path, monkeypatch):
    monkeypatch.setenv("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")
    version = f"{TORCH_RELEASE}.post1"  # torch_npu 2.x.y.postN pairs with torch 2.x.y
    write_torch_npu(on_path, SUCCESS.format(version=version, soc=223, count=2))
    caps = probe_npu(timeout_s=120)
    assert caps.available, caps.reason
    assert (caps.failure_mode, caps.reason) == (None, None)
    assert caps.device_count == 2 and [d.name for d in caps.devices] == ["Ascend910B3"] * 2
    assert caps.devices[0].total_memory_bytes == 64 * 2**30
    assert (caps.soc_name, caps.soc_version, caps.soc_family) == ("Ascend910B3", 223, "910B/A2")
    assert (caps.torch_npu_version, caps.torch_npu_built_for_torch) == (version, TORCH_RELEASE)
    assert caps.version_mismatch is False and caps.hint is None


def fake_imported_torch_npu(monkeypatch, version: str, soc: int, count: int) -> None:
    """A torch_npu already imported in this process: the probe asks it directly, without a child."""
    module = types.ModuleType("torch_npu")
    module.__spec__ = importlib.machinery.ModuleSpec("torch_npu", None)
    module.__version__ = version
    module._C = types.SimpleNamespace(_npu_get_soc_version=lambda: soc)
    module.npu = types.SimpleNamespace(device_count=lambda: count, get_device_name=lambda i=0: "Ascend910_9392",
                                       get_device_properties=lambda i: types.SimpleNamespace(total_memory=None))
    monkeypatch.setitem(sys.modules, "torch_npu", module)


def test_version_mismatch_is_reported_with_the_fix(monkeypatch):
    fake_imported_torch_npu(monkeypatch, version="2.1.0.post10", soc=253, count=1)
    caps = probe_npu()
    assert caps.available and caps.soc_family == "910_93/A3" and caps.devices[0].total_memory_bytes is None
    assert caps.version_mismatch is True
    assert "built for torch 2.1.0" in caps.hint and "pip install torch==2.1.0" in caps.hint


def test_no_devices(monkeypatch):
    monkeypatch.setenv("ASCEND_RT_VISIBLE_DEVICES", "")
    fake_imported_torch_npu(monkeypatch, version=TORCH_RELEASE, soc=223, count=0)
    caps = probe_npu()
    assert caps.failure_mode == "no_devices" and "sees no NPU" in caps.reason
    assert "ASCEND_RT_VISIBLE_DEVICES=''" in caps.reason
    assert caps.soc_version is None  # nothing to ask without a device


def test_a_failing_device_query_is_reported(monkeypatch):
    fake_imported_torch_npu(monkeypatch, version=TORCH_RELEASE, soc=223, count=1)

    def no_device(i):
        raise RuntimeError("call aclrtSetDevice failed, error code 507033")

    monkeypatch.setattr(sys.modules["torch_npu"].npu, "get_device_properties", no_device)
    caps = probe_npu()
    assert caps.failure_mode == "query_failed" and "aclrtSetDevice failed" in caps.reason


def test_hanging_import_times_out(on_path, monkeypatch):
    monkeypatch.setenv("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")
    write_torch_npu(on_path, "import time\ntime.sleep(600)\n")
    caps = probe_npu(timeout_s=1)
    assert caps.failure_mode == "timeout" and "did not finish within 1 s" in caps.reason


@pytest.mark.parametrize("soc, family", [
    (200, "310P"), (205, "310P"), (220, "910B/A2"), (223, "910B/A2"), (225, "910B/A2"),
    (250, "910_93/A3"), (255, "910_93/A3"), (260, "A5/950"),
    (199, None), (226, None), (256, None), (261, None), (-1, None), (None, None),
])
def test_soc_number_to_family(soc, family):
    assert soc_family(soc) == family


@pytest.mark.parametrize("version, release", [
    ("2.5.1.post2", "2.5.1"), ("2.1.0.post10", "2.1.0"), ("2.13.0+cpu", "2.13.0"), ("2.6.0rc1", "2.6.0"),
    ("2.4", "2.4.0"), (None, None), ("dev", None),
])
def test_release_embedded_in_versions(version, release):
    assert release_of(version) == release


def test_driver_missing_is_told_apart_from_cann_missing():
    stderr = ("Traceback (most recent call last):\n  File \"<string>\", line 1\n"
              "ImportError: libascend_hal.so: cannot open shared object file: No such file or directory\n")
    failure = classify_failure("import torch_npu", stderr, 3)
    assert failure.mode == "driver_missing" and "npu-smi" in failure.hint


def test_other_import_errors_keep_their_text():
    stderr = "Traceback (most recent call last):\nAttributeError: module 'torch' has no attribute 'xyz'\n"
    failure = classify_failure("import torch_npu", stderr, 3)
    assert failure.mode == "import_failed"
    assert failure.import_error == "AttributeError: module 'torch' has no attribute 'xyz'"


def test_a_crash_without_output_is_reported_by_signal():
    failure = classify_failure(None, "", -11)
    assert failure.mode == "import_failed" and "signal 11" in failure.reason


def test_cann_version_from_the_toolkit_install_info(tmp_path):
    arch_dir = tmp_path / "latest" / "aarch64-linux"
    arch_dir.mkdir(parents=True)
    (arch_dir / "ascend_toolkit_install.info").write_text(
        "package_name=Ascend-cann-toolkit\nversion=8.0.RC2\ninnerversion=V100R001C18SPC001B232\narch=aarch64\n")
    version, home = read_cann_version({"ASCEND_HOME_PATH": str(tmp_path / "latest")})
    assert (version, home) == ("8.0.RC2", str(tmp_path / "latest"))


def test_cann_version_unknown_without_a_toolkit(tmp_path):
    if Path("/usr/local/Ascend").exists():
        pytest.skip("a CANN toolkit is installed here")
    assert read_cann_version({"ASCEND_HOME_PATH": str(tmp_path)}) == (None, None)
