#!/usr/bin/env bash
# First contact with a CUDA GPU (<= 8 minutes on an H200): see scripts/gpu_first_contact.py.
#   bash scripts/gpu_first_contact.sh --out docs/results/<date>/gpu/first_contact.json
#   bash scripts/gpu_first_contact.sh --dry-run --out /tmp/gpu_first_contact.json   # CPU, TRITON_INTERPRET=1
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-$( [[ -x .venv/bin/python ]] && echo .venv/bin/python || echo python3 )}"
exec timeout 480 "$PYTHON" scripts/gpu_first_contact.py "$@"
