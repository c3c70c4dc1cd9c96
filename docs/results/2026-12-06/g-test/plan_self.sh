#!/usr/bin/env bash
# Added after draft_model (self)'s first 10,000 gave p = 0.016: more of it, fresh seeds, both settings.
# Run from the repository root: bash docs/results/2026-12-06/g-test/plan_self.sh
set -uo pipefail
cd "$(git rev-parse --show-toplevel)"
here=docs/results/2026-12-06/g-test
run() { OMP_NUM_THREADS=1 TORCH_DEVICE_BACKEND_AUTOLOAD=0 .venv/bin/python "$here/run.py" "$@" || echo "FAILED: $*"; }
run --method "draft_model (self)" --setting suite --n 20000 --seed-index 305
run --method "draft_model (self)" --setting issue --n 20000 --seed-index 306
