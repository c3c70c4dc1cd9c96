#!/usr/bin/env bash
# The big runs, once the load on the shared VM had dropped: 100,000 requests each (five generate calls of
# 20,000, seed indexes 31..35 and 431..435), draft_model at the issue's setting and the noisy self-drafter.
# Run from the repository root: bash docs/results/2026-12-06/g-test/plan_big.sh
set -uo pipefail
cd "$(git rev-parse --show-toplevel)"
here=docs/results/2026-12-06/g-test
run() { OMP_NUM_THREADS=1 TORCH_DEVICE_BACKEND_AUTOLOAD=0 .venv/bin/python "$here/run.py" "$@" || echo "FAILED: $*"; }
run --method draft_model --setting issue --n 100000 --seed-index 31
run --method "draft_model (noisy self)@0.1" --setting issue --n 100000 --seed-index 431
