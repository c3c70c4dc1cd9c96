#!/usr/bin/env bash
# Plain decoding (and ngram) per-token CPU time in two trees, interleaved A, B, A, B ... (README.md here).
#   git worktree add /tmp/abA 3925974; git worktree add /tmp/abB 6222772
#   bash docs/results/2026-12-06/plain-ab/run.sh /tmp/abA /tmp/abB [ROUNDS]    # lines to $OUT
# Each tree is imported from its own files: a directory whose `hyspec` entry links to the tree's core/ goes
# first on PYTHONPATH (as codebase/bench_ab.sh does).
set -euo pipefail
cd "$(dirname "$0")/../../../.."
A=$(cd "${1:?first checkout}" && pwd); B=$(cd "${2:?second checkout}" && pwd); ROUNDS=${3:-3}
OUT=${OUT:-/tmp/plain-ab.txt}
PY=$PWD/.venv/bin/python
declare -A PKG ROOT=([A]=$A [B]=$B)
for t in A B; do
    PKG[$t]=$(mktemp -d); ln -s "${ROOT[$t]}/core" "${PKG[$t]}/hyspec"
    for d in backends npu_ops cuda_ops cpu_ops; do [ -e "${ROOT[$t]}/core/$d" ] || ln -s "../$d" "${ROOT[$t]}/core/$d"; done
done
for r in $(seq 1 "$ROUNDS"); do for mode in plain ngram; do for t in A B; do
    PYTHONPATH=${PKG[$t]} TORCH_DEVICE_BACKEND_AUTOLOAD=0 "$PY" docs/results/2026-12-06/plain-ab/cpu_ab.py $mode \
        | sed "s/^/$t $r /" >> "$OUT"
done; done; done
