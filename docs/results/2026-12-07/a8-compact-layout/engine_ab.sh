#!/usr/bin/env bash
# The engine on BASE's qgemm_a8.c and on the checked-out one, alternately, one process each: in every process a8
# and the exact path run interleaved (../a8-k-quants/interleaved.py), so the exact path -- unchanged -- is the
# yardstick for the VM's drift.  BASE's kernel is put in place with `git show` and the file restored on exit.
#
#     bash docs/results/2026-12-07/a8-compact-layout/engine_ab.sh BASE_COMMIT DEFAULT.gguf Q4_K_M.gguf 7B.gguf
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
BASE=$1; DEFAULT=$2; Q4KM=$3; SEVEN=$4
git diff --quiet -- cpu_ops/qgemm_a8.c || { echo "cpu_ops/qgemm_a8.c has local changes" >&2; exit 1; }
trap 'git checkout -q -- cpu_ops/qgemm_a8.c' EXIT
export TORCH_DEVICE_BACKEND_AUTOLOAD=0
I=docs/results/2026-12-07/a8-k-quants/interleaved.py
for round in 1 2; do
  for kernel in head base; do
    if [ $kernel = base ]; then git show "$BASE:cpu_ops/qgemm_a8.c" > cpu_ops/qgemm_a8.c
    else git checkout -q -- cpu_ops/qgemm_a8.c; fi
    echo "== kernel $kernel, round $round, $(date -u +%H:%M:%S)"
    for f in "$DEFAULT:3:48" "$Q4KM:3:48" "$SEVEN:2:32"; do
      IFS=: read -r path rounds tokens <<< "$f"
      echo "-- $(basename "$path")"
      .venv/bin/python $I "$path" humaneval "$rounds" "$tokens" 2>&1 | grep -E "tok/s|median"
    done
  done
done
