# Sourced by q5km.sh and after_l2.sh (with their arguments): the repository root as the working directory, this
# folder, the folder of GGUF files (first argument, default /tmp/a8-k-quants) and llama.cpp's Python.
set -euo pipefail
export TORCH_DEVICE_BACKEND_AUTOLOAD=0
cd "$(git rev-parse --show-toplevel)"
HERE=docs/results/2026-12-07/a8-compact-layout
WORK=${1:-/tmp/a8-k-quants}
LLAMACPP_PY=${LLAMACPP_PY:?set LLAMACPP_PY to a Python with llama-cpp-python}
