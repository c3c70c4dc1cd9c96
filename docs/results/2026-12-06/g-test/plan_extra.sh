#!/usr/bin/env bash
# Runs added once plan.sh's draft_model lane had finished (same rules: seed indexes never repeat within a group).
# Run from the repository root: bash docs/results/2026-12-06/g-test/plan_extra.sh
set -uo pipefail
cd "$(git rev-parse --show-toplevel)"
here=docs/results/2026-12-06/g-test
run() { OMP_NUM_THREADS=1 TORCH_DEVICE_BACKEND_AUTOLOAD=0 .venv/bin/python "$here/run.py" "$@" || echo "FAILED: $*"; }

# the test suite's own seeds (seed index 0): the default tier's first 3,000 at the issue's setting, and the
# slow tier's 30,000 at the suite's PARAMS in one generate call (--chunk 30000 keeps seeds 0..29999)
run --method draft_model --setting issue --n 3000 --seed-index 0
run --method draft_model --setting suite --n 30000 --chunk 30000 --seed-index 0
# (draft length, dense drafter: run.py --method draft_model+k1 / +k2 / +dense; not run, there was no bias to
# localise; the "one big run" is the pooled draft_model @ issue runs of plan.sh instead, same statistics)
run --self-check --summary > /dev/null
