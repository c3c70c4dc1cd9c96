"""The Dockerfiles pin their versions and run `hyspec probe` / `hyspec serve` (no Docker engine runs here)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

DOCKER = Path(__file__).resolve().parents[1] / "docker"
BACKENDS = {"Dockerfile.cpu": "cpu", "Dockerfile.cuda": "cuda", "Dockerfile.ascend": "npu"}


@pytest.mark.parametrize("name, backend", sorted(BACKENDS.items()))
def test_dockerfile_pins_and_commands(name, backend):
    text = (DOCKER / name).read_text()
    base = re.search(r"^FROM (\S+)", text, re.M).group(1)
    assert ":" in base and not base.endswith(":latest"), f"{name}: base image must carry a version tag"
    installs = re.findall(r"pip install ([^\n\\]+)", text)
    packages = [tok for line in installs for tok in line.split()
                if not tok.startswith(("-", "'", "https:", "&&")) and tok not in ("-e",)]
    unpinned = [p for p in packages if "==" not in p]
    assert not unpinned, f"{name}: unpinned packages {unpinned}"
    assert "torch==" in text
    healthcheck = re.search(r"^HEALTHCHECK .*$", text, re.M | re.S).group(0)
    assert f"hyspec probe --backend {backend}" in healthcheck.replace('", "', " ").replace('["', "").replace('"]', "")
    cmd = [line for line in text.splitlines() if line.startswith("CMD")][-1]
    assert "hyspec" in cmd and "serve" in cmd
    assert f"HYSPEC_BACKEND={backend}" in text


def test_ascend_image_names_cann_version_chip_and_matching_torch_npu():
    text = (DOCKER / "Dockerfile.ascend").read_text()
    assert re.search(r"FROM quay\.io/ascend/cann:\d+\.\d+\.\w+-910b-", text)
    torch_v = re.search(r"torch==([\d.]+)", text).group(1)
    npu_v = re.search(r"torch-npu==([\d.]+)", text).group(1)
    assert npu_v.startswith(torch_v), "torch-npu must be the build for the pinned torch"


def test_ascend_image_is_the_documented_stack_with_both_environment_scripts():
    """CANN 9.1.0 + torch 2.10.0 + torch-npu 2.10.0.post4 (vllm-ascend main's triple), toolkit and NNAL sourced."""
    text = (DOCKER / "Dockerfile.ascend").read_text()
    assert "FROM quay.io/ascend/cann:9.1.0-910b-ubuntu22.04-py3.12" in text
    assert "torch==2.10.0 " in text and "torch-npu==2.10.0.post4" in text
    for line in [line for line in text.splitlines() if line.startswith(("CMD", "    CMD"))]:
        assert "source /usr/local/Ascend/ascend-toolkit/set_env.sh" in line
        assert "source /usr/local/Ascend/nnal/atb/set_env.sh" in line
    from hyspec.npu_ops.op_schemas import PINNED_BRANCH, load_release

    pinned = load_release(PINNED_BRANCH)
    assert pinned.torch_npu[0] == "2.10.0.post4" and pinned.cann == "9.1.0" and pinned.torch[0] == "2.10.0"


def test_the_npu_extra_pins_the_documented_torch_npu():
    import tomllib

    project = tomllib.loads((DOCKER.parent / "pyproject.toml").read_text())["project"]
    assert project["optional-dependencies"]["npu"] == ["torch-npu==2.10.0.post4"]
    torch_req = next(r for r in project["dependencies"] if r.startswith("torch"))
    low = re.search(r">=\s*([\d.]+)", torch_req).group(1)
    assert tuple(map(int, low.split("."))) <= (2, 10), "the core must run on the pinned stack's torch 2.10"
