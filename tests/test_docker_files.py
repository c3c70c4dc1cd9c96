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
