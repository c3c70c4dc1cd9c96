#!/usr/bin/env bash
# Added after the first noisy-self run at max_tokens 8 (seed index 441) gave y2 p = 0.0029: independent
# repeats of that configuration, three of 20,000 and one of 100,000, to see whether the p shrinks with n.
# Run from the repository root: bash docs/results/2026-12-06/g-test/plan_deep_repeat.sh
set -uo pipefail
cd "$(git rev-parse --show-toplevel)"
here=docs/results/2026-12-06/g-test
run() { OMP_NUM_THREADS=1 TORCH_DEVICE_BACKEND_AUTOLOAD=0 .venv/bin/python "$here/run.py" --max-tokens 8 "$@" \
  || echo "FAILED: $*"; }
run --method "draft_model (noisy self)@0.1" --setting issue --n 20000 --repeats 3 --seed-index 501
run --method "draft_model (noisy self)@0.1" --setting issue --n 100000 --seed-index 511
