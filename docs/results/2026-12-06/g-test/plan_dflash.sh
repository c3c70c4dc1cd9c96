#!/usr/bin/env bash
# Added last: dflash's second 10,000 (seed index 352) gave y3 p = 0.009 and (y1, y2) p = 0.035; one more
# independent 20,000. Run from the repository root: bash docs/results/2026-12-06/g-test/plan_dflash.sh
set -uo pipefail
cd "$(git rev-parse --show-toplevel)"
OMP_NUM_THREADS=1 TORCH_DEVICE_BACKEND_AUTOLOAD=0 .venv/bin/python docs/results/2026-12-06/g-test/run.py \
  --method dflash --setting suite --n 20000 --seed-index 353
