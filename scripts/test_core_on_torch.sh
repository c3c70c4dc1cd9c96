#!/usr/bin/env bash
# Run hyspec's default test suite on another torch release, in a venv of its own (CPU only; not part of CI).
# The Ascend stack pins torch 2.10.0 (docs/npu.md), so the core must keep running on it:
#   bash scripts/test_core_on_torch.sh 2.10.0 [pytest args...]
# PyPI's Linux x86_64 wheel for torch 2.x is the CUDA build: it runs on a CPU-only machine with its
# nvidia-* dependencies installed (about 3 GB), which is why this is not in the default set-up.
set -euo pipefail
cd "$(dirname "$0")/.."
version="${1:?usage: scripts/test_core_on_torch.sh TORCH_VERSION [pytest args...]}"
shift
venv="${VENV:-/tmp/hyspec-torch-$version}"
[[ -x "$venv/bin/python" ]] || python3 -m venv "$venv"
"$venv/bin/pip" install -q "torch==$version"
"$venv/bin/pip" install -q -e ".[dev]"
"$venv/bin/python" -c "import torch; assert torch.__version__.startswith('$version'), torch.__version__; print('torch', torch.__version__)"
exec "$venv/bin/python" -m pytest -q -n 2 -p no:cacheprovider "${@:-tests/}"
