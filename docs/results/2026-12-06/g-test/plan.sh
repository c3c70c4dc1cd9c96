#!/usr/bin/env bash
# The runs behind results.json: two lanes side by side on the 2-core VM (each lane one process at a time).
# Seed indexes never repeat across runs (run.py: request i of seed index s gets seed s * 1_000_003 + i).
# Run from the repository root: bash docs/results/2026-12-06/g-test/plan.sh
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
here=docs/results/2026-12-06/g-test
run() { OMP_NUM_THREADS=1 TORCH_DEVICE_BACKEND_AUTOLOAD=0 .venv/bin/python "$here/run.py" "$@"; }

lane_a() {  # draft_model: the issue's setting, three independent runs, the suite's setting, then more for pooling
  run --method draft_model --setting issue --n 20000 --repeats 3 --seed-index 1
  run --method draft_model --setting suite --n 20000 --seed-index 11
  run --method draft_model --setting issue --n 20000 --repeats 5 --seed-index 4
}

lane_b() {  # the control (no speculation), then every other method at the suite's PARAMS, 10,000 twice
  run --method plain --setting issue --n 20000 --repeats 5 --seed-index 201
  run --method plain --setting suite --n 20000 --repeats 3 --seed-index 211
  local i=301
  for pass in 0 1; do
    for m in "draft_model (self)" remote eagle eagle3 mtp dflash dspark ngram suffix hybrid; do
      run --method "$m" --setting suite --n 10000 --seed-index $((i + pass))
      i=$((i + 10))
    done
    i=301
  done
}

lane_a > "$here/lane_a.log" 2>&1 &
a=$!
lane_b > "$here/lane_b.log" 2>&1 &
b=$!
wait $a; wait $b
run --summary > /dev/null
