"""The probe report, backend selection, the CUDA and Ray probes, and `hyspec probe` end to end."""
from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest
import torch

from hyspec.backends import cpuinfo
from hyspec.backends.probe import clear_cache, probe
from hyspec.backends.probe_cuda import probe_cuda
from hyspec.backends.probe_dist import parse_ray_address, probe_dist
from hyspec.backends.records import SCHEMA_VERSION, X86_ISA_FLAGS, drafting_methods
from hyspec.backends.selection import requested_backend, select_backend
from hyspec.cli.main import main
from hyspec.errors import BackendUnavailableError, ConfigError, HyspecError

ON_CPU_ONLY_BOX = torch.version.cuda is None and __import__("importlib").util.find_spec("torch_npu") is None


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    monkeypatch.delenv("HYSPEC_BACKEND", raising=False)
    clear_cache()
    yield
    clear_cache()


# --- selection ---------------------------------------------------------------------------------------------

ONLY_CPU = {"npu": (False, "torch_npu is not installed", "pip install 'hyspec[npu]'"),
            "cuda": (False, "torch was built without CUDA", "install a CUDA build of torch"),
            "cpu": (True, None, None)}


def test_auto_prefers_npu_then_cuda_then_cpu():
    every = {name: (True, None, None) for name in ONLY_CPU}
    assert select_backend("auto", "auto", every) == "npu"
    assert select_backend("auto", "auto", {**every, "npu": ONLY_CPU["npu"]}) == "cuda"
    assert select_backend("auto", "auto", ONLY_CPU) == "cpu"


def test_forcing_an_unavailable_backend_names_what_is_missing_and_how_to_get_it():
    with pytest.raises(BackendUnavailableError) as err:
        select_backend("cuda", "HYSPEC_BACKEND", ONLY_CPU)
    assert "'cuda'" in str(err.value) and "HYSPEC_BACKEND" in str(err.value)
    assert "built without CUDA" in str(err.value) and "install a CUDA build of torch" in str(err.value)


@pytest.mark.parametrize("raw, expected", [("cpu", "cpu"), (" CUDA ", "cuda"), ("Npu", "npu"), ("auto", "auto")])
def test_backend_names_are_read_leniently(raw, expected):
    assert requested_backend(raw, env={}) == (expected, "argument")
    assert requested_backend(None, env={"HYSPEC_BACKEND": raw}) == (expected, "HYSPEC_BACKEND")


def test_argument_wins_over_environment_and_empty_environment_means_auto():
    assert requested_backend("cpu", env={"HYSPEC_BACKEND": "npu"}) == ("cpu", "argument")
    assert requested_backend(None, env={"HYSPEC_BACKEND": ""}) == ("auto", "auto")
    assert requested_backend(None, env={}) == ("auto", "auto")


@pytest.mark.parametrize("raw", ["gpu", "cuda:1", "cpu,cuda", "ascend"])
def test_malformed_names_list_the_valid_ones(raw):
    with pytest.raises(ConfigError) as err:
        requested_backend(None, env={"HYSPEC_BACKEND": raw})
    assert err.value.key == "HYSPEC_BACKEND"
    assert "valid names: cpu, cuda, npu, auto" in str(err.value)


# --- the report on this machine ----------------------------------------------------------------------------

def test_probe_is_cached_per_process_and_fresh_on_request():
    first = probe()
    assert probe().backends[2].capabilities is first.backends[2].capabilities
    assert probe(fresh=True).backends[2].capabilities is not first.backends[2].capabilities


def test_report_holds_every_backend_and_the_schema_version():
    report = probe()
    data = json.loads(report.to_json())
    assert data["schema_version"] == SCHEMA_VERSION == 1
    assert list(data["backends"]) == ["npu", "cuda", "cpu"] == data["selection_order"]
    cpu = data["backends"]["cpu"]
    assert cpu["available"] is True and cpu["methods"] == list(drafting_methods())
    # ops come from the backend object's OpTable, whatever ops it holds
    from hyspec.backends.registry import get_backend

    assert cpu["ops"] == get_backend("cpu").ops.sources
    for name in ("npu", "cuda"):
        if not data["backends"][name]["available"]:
            assert data["backends"][name]["reason"] and data["backends"][name]["methods"] == []
    assert set(data["dist"]) >= {"ray_installed", "ray_version", "address", "connected", "nodes"}


def test_forced_cpu_and_unknown_names_through_probe(monkeypatch):
    assert probe(backend="cpu").selected == "cpu"
    monkeypatch.setenv("HYSPEC_BACKEND", "gpu")
    with pytest.raises(ConfigError, match="valid names"):
        probe()


@pytest.mark.skipif(not ON_CPU_ONLY_BOX, reason="this box has an accelerator")
def test_forcing_cuda_or_npu_here_raises():
    with pytest.raises(BackendUnavailableError, match="CUDA"):
        probe(backend="cuda")
    with pytest.raises(BackendUnavailableError, match="torch_npu is not installed"):
        probe(backend="npu")


@pytest.mark.skipif(not (ON_CPU_ONLY_BOX and Path("/proc/cpuinfo").exists()), reason="needs a CPU-only Linux box")
def test_hyspec_probe_json_on_this_machine():
    env = {k: v for k, v in os.environ.items() if k != "HYSPEC_BACKEND"}
    r = subprocess.run([sys.executable, "-m", "hyspec.cli.main", "probe", "--json"], capture_output=True,
                       text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    cpu, cuda, npu = (data["backends"][n] for n in ("cpu", "cuda", "npu"))
    assert cpu["available"] and cpu["source"] == "/proc/cpuinfo"
    text = Path("/proc/cpuinfo").read_text()
    flags_line = next((line for line in text.splitlines() if line.startswith("flags")), None)
    if flags_line is not None:  # x86: every flag hyspec cares about is reported exactly as the kernel lists it
        listed = set(flags_line.split(":", 1)[1].split())
        assert cpu["isa"] == {flag: flag in listed for flag in X86_ISA_FLAGS}
    assert cuda["available"] is False and "without CUDA" in cuda["reason"]
    assert npu["available"] is False and npu["reason"] == "torch_npu is not installed"
    assert data["selected"] == "cpu"


def test_table_output_and_exit_codes(capsys, monkeypatch):
    assert main(["probe"]) == 0
    out = capsys.readouterr().out
    assert "selected: " in out and "methods" in out and "isa" in out
    assert main(["probe", "--backend", "gpu"]) == 2
    assert capsys.readouterr().err.strip() == (
        "hyspec probe: error: backend: 'gpu' is not a backend; valid names: cpu, cuda, npu, auto")
    monkeypatch.setenv("HYSPEC_BACKEND", "cuda:0")
    assert main(["probe", "--json"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "HYSPEC_BACKEND" in err


@pytest.mark.skipif(not ON_CPU_ONLY_BOX, reason="this box has an accelerator")
def test_forced_unavailable_backend_exits_2_with_one_line(capsys):
    assert main(["probe", "--backend", "npu"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "torch_npu is not installed" in err and "hyspec[npu]" in err


def test_without_proc_cpuinfo_the_probe_says_what_is_unknown(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(cpuinfo, "PROC_CPUINFO", tmp_path / "no-cpuinfo")
    monkeypatch.setattr(cpuinfo, "_run_sysctl", lambda key: None)  # no sysctl either (not macOS)
    assert main(["probe"]) == 0
    out = capsys.readouterr().out
    assert "unknown" in out and "read from platform" in out
    cpu = probe().backend("cpu").capabilities
    assert cpu.source == "platform" and "isa" in cpu.unknown_fields and cpu.available


# --- CUDA, with torch.cuda faked: the GPU path runs on a CPU box ------------------------------------------

def test_cuda_probe_on_faked_devices(monkeypatch):
    import hyspec.backends.triton_check as triton_check

    props = [types.SimpleNamespace(name="NVIDIA H200", major=9, minor=0, total_memory=141 << 30,
                                   multi_processor_count=132),
             types.SimpleNamespace(name="Tesla T4", major=7, minor=5, total_memory=15 << 30,
                                   multi_processor_count=40)]
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: props[i])
    monkeypatch.setattr(triton_check, "triton_compiles_on",
                        lambda device: None if device.index == 0 else "CompilationError: sm_75 unsupported")
    caps = probe_cuda()
    assert caps.available and caps.device_count == 2 and caps.torch_cuda_version == "12.8"
    h200, t4 = caps.devices
    assert (h200.compute_capability, h200.bf16_supported, h200.triton_can_compile) == ((9, 0), True, True)
    assert (t4.bf16_supported, t4.triton_can_compile) == (False, False)
    assert caps.triton_can_compile is False and "cuda:1" in caps.triton_reason
    assert h200.to_dict()["compute_capability"] == "9.0"


def test_cuda_build_without_devices(monkeypatch):
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    caps = probe_cuda()
    assert not caps.available and "sees no device" in caps.reason and "CUDA_VISIBLE_DEVICES=''" in caps.reason
    assert caps.triton_can_compile is False and "no CUDA device" in caps.triton_reason


def test_triton_check_kernel_runs_under_the_interpreter():
    # the compile check's kernel itself, run by Triton's CPU interpreter (no GPU here)
    code = ("import torch; from hyspec.backends.triton_check import triton_compiles_on; "
            "print(triton_compiles_on(torch.device('cpu')))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "TRITON_INTERPRET": "1"})
    assert r.returncode == 0 and r.stdout.strip() == "None", r.stdout + r.stderr


# --- Ray ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("address, target", [
    ("10.0.0.1:6380", ("10.0.0.1", 6380)), ("10.0.0.1", ("10.0.0.1", 6379)),
    ("ray://head:10002", ("head", 10002)), ("ray://head", ("head", 10001)), ("auto", None),
])
def test_ray_addresses(address, target):
    assert parse_ray_address(address) == target


@pytest.mark.parametrize("address", ["local", "", "head:port", "ray://head:1/x"])
def test_bad_ray_addresses_are_config_errors(address):
    with pytest.raises(ConfigError, match="--ray-address"):
        parse_ray_address(address)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_cluster_gives_a_reason_quickly():
    dist = probe_dist(f"127.0.0.1:{closed_port()}")
    assert dist.connected is False and "cannot reach the Ray cluster" in dist.reason


STAND_IN_RAY = """\
    __version__ = "2.60.0"
    _MARKER = {marker!r}

    def init(address=None, **kwargs):
        assert address == {address!r}, address

    def nodes():
        return [{{"NodeID": "n1", "NodeManagerAddress": "10.0.0.1", "Alive": True,
                  "Resources": {{"CPU": 64.0, "NPU": 8.0, "node:10.0.0.1": 1.0}}}},
                {{"NodeID": "n2", "NodeManagerAddress": "10.0.0.2", "Alive": False, "Resources": {{"CPU": 32.0}}}}]

    def cluster_resources():
        return {{"CPU": 96.0, "NPU": 8.0}}

    def shutdown():
        open(_MARKER, "w").close()
"""


def test_cluster_nodes_and_resources_through_a_stand_in_ray(tmp_path, monkeypatch):
    with socket.socket() as listener:  # the reachability check needs something listening
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        address = f"127.0.0.1:{listener.getsockname()[1]}"
        (tmp_path / "ray").mkdir()
        marker = tmp_path / "shut-down"
        (tmp_path / "ray" / "__init__.py").write_text(
            textwrap.dedent(STAND_IN_RAY.format(marker=str(marker), address=address)))
        monkeypatch.setenv("PYTHONPATH", str(tmp_path))
        dist = probe_dist(address)
    assert dist.connected, dist.reason
    assert [(n.node_id, n.address, n.alive) for n in dist.nodes] == [("n1", "10.0.0.1", True),
                                                                     ("n2", "10.0.0.2", False)]
    assert dict(dist.nodes[0].resources)["NPU"] == 8.0
    assert dist.to_dict()["cluster_resources"] == {"CPU": 96.0, "NPU": 8.0}
    assert marker.exists()  # ray.shutdown() ran: the probe leaves no connection behind


def test_autoload_failure_in_process_is_a_hyspec_error_not_a_traceback():
    # what probe() does when torch is not imported yet and the NPU child saw autoload break torch
    from hyspec.backends import probe as probe_module
    from hyspec.backends.records import NpuCapabilities

    caps = NpuCapabilities(available=False, reason="`import torch` fails: ...", hint="export "
                           "TORCH_DEVICE_BACKEND_AUTOLOAD=0 ...", installed=True, failure_mode="autoload_broken",
                           import_error=None, torch_version=None, torch_npu_version=None,
                           torch_npu_built_for_torch=None, version_mismatch=None, device_count=0, devices=(),
                           soc_name=None, soc_version=None, soc_family=None, cann_version=None, cann_home=None)
    with pytest.raises(HyspecError, match="TORCH_DEVICE_BACKEND_AUTOLOAD=0"):
        probe_module._require_importable_torch(caps, torch_imported=False)
    probe_module._require_importable_torch(caps, torch_imported=True)  # torch already works here: report it


def test_docs_describe_every_field_of_the_json():
    doc = (Path(__file__).resolve().parents[1] / "docs" / "probe.md").read_text()
    documented = set(re.findall(r"^\| `(\w+)` \|", doc, re.MULTILINE))
    data = probe().to_dict()
    keys = set(data) | set(data["dist"])
    for backend in data["backends"].values():
        keys |= set(backend)
    assert keys - documented == set(), "fields missing from docs/probe.md"
    assert f"schema_version` | int | `{SCHEMA_VERSION}`" in doc
