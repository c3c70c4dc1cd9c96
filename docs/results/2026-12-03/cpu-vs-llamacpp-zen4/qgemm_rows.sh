#!/usr/bin/env bash
# The qgemm kernel before (commit b13355d) and after the AVX-512 tiles, interleaved in one run, weights from memory.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd); ROOT=$(git -C "$HERE" rev-parse --show-toplevel); TMP=$(mktemp -d)
git -C "$ROOT" show b13355d:cpu_ops/qgemm.c > "$TMP/before.c"; cp "$ROOT/cpu_ops/qgemm.c" "$TMP/after.c"
for v in before after; do gcc -O3 -march=native -fopenmp -std=gnu11 -I "$ROOT/cpu_ops" -o "$TMP/$v" "$HERE/qgemm_rows.c" "$TMP/$v.c" -lm; done
for round in 1 2; do for v in before after; do echo "== $v (round $round)"; OMP_NUM_THREADS=2 "$TMP/$v" 0; done; done
rm -rf "$TMP"
