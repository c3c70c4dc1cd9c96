#!/usr/bin/env bash
# The L1 (BASE) against the L2 (checked out) prefetch hint of qgemm_a8.c, alternately, three times: one pass over a
# 7B-shaped step's distinct matrices (stream_step.py), the 7B-shaped decode step (decode_step.py), and a8 / exact
# interleaved on the default and the Q4_K_M file.  BASE's kernel is put in place with `git show`, restored on exit.
#
#     bash docs/results/2026-12-07/a8-compact-layout/prefetch_ab.sh BASE_COMMIT DEFAULT.gguf Q4_K_M.gguf 7B.gguf
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
BASE=$1; DEFAULT=$2; Q4KM=$3; SEVEN=$4
HERE=docs/results/2026-12-07/a8-compact-layout
git diff --quiet -- cpu_ops/qgemm_a8.c || { echo "cpu_ops/qgemm_a8.c has local changes" >&2; exit 1; }
trap 'git checkout -q -- cpu_ops/qgemm_a8.c' EXIT
export TORCH_DEVICE_BACKEND_AUTOLOAD=0
use() { if [ "$1" = L1 ]; then git show "$BASE:cpu_ops/qgemm_a8.c" > cpu_ops/qgemm_a8.c; else git checkout -q -- cpu_ops/qgemm_a8.c; fi; }
for v in L1 L2 L1 L2 L1 L2; do use $v; echo "$v $(.venv/bin/python $HERE/stream_step.py | grep -E 'pass|repeated' | tr '\n' ' ')"; done
for v in L1 L2 L1 L2; do use $v; echo "$v 7B $(.venv/bin/python $HERE/decode_step.py "$SEVEN" 64 2>&1 | grep 'decode step')"; done
for v in L1 L2 L1 L2; do
  use $v
  for f in "$DEFAULT" "$Q4KM"; do
    echo "$v $(basename "$f") $(.venv/bin/python docs/results/2026-12-07/a8-k-quants/interleaved.py "$f" humaneval 3 48 2>&1 | grep 'a8 / exact')"
  done
done
