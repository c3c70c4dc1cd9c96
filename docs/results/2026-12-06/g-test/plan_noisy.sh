#!/usr/bin/env bash
# Added after seeing that the suite's random drafters are accepted ~4 % (draft_model) or never (eagle): a
# drafter that is the target plus noise (run.py noisy_self_drafter) is accepted 58 % at scale 0.1 and 87 % at
# 0.03 (500-request probes), so both branches of the rejection sampler carry real mass.
# Run from the repository root: bash docs/results/2026-12-06/g-test/plan_noisy.sh
set -uo pipefail
cd "$(git rev-parse --show-toplevel)"
here=docs/results/2026-12-06/g-test
run() { OMP_NUM_THREADS=1 TORCH_DEVICE_BACKEND_AUTOLOAD=0 .venv/bin/python "$here/run.py" "$@" || echo "FAILED: $*"; }
run --method "draft_model (noisy self)@0.1" --setting issue --n 20000 --repeats 3 --seed-index 401
run --method "draft_model (noisy self)@0.1" --setting suite --n 20000 --seed-index 411
run --method "draft_model (noisy self)@0.03" --setting issue --n 20000 --seed-index 421
