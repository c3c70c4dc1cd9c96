#!/usr/bin/env bash
# dense_gemm.c at one and a few rows, BEFORE (a git revision, default HEAD~) and the working tree, interleaved.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd); ROOT=$(git -C "$HERE" rev-parse --show-toplevel); TMP=$(mktemp -d)
mkdir -p "$TMP/before"
for f in dense_gemm.c bf16.h; do git -C "$ROOT" show "${BEFORE:-HEAD~}:cpu_ops/$f" > "$TMP/before/$f"; done
gcc -O3 -march=native -fopenmp -std=gnu11 -o "$TMP/before/rows" "$HERE/dense_rows.c" "$TMP/before/dense_gemm.c"
gcc -O3 -march=native -fopenmp -std=gnu11 -o "$TMP/after" "$HERE/dense_rows.c" "$ROOT/cpu_ops/dense_gemm.c"
for round in 1 2 3; do
  echo "before $(OMP_NUM_THREADS=2 "$TMP/before/rows" ${DTYPE:-1} ${MS:-1})"; echo "after  $(OMP_NUM_THREADS=2 "$TMP/after" ${DTYPE:-1} ${MS:-1})"
done
rm -rf "$TMP"
