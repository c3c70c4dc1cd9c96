#!/usr/bin/env bash
# qgemm (fp32 activations) and qgemm_a8 (8-bit activations) on SmolLM2's shapes, interleaved in one run, weights from memory.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd); ROOT=$(git -C "$HERE" rev-parse --show-toplevel); TMP=$(mktemp -d)
gcc -O3 -march=native -fopenmp -std=gnu11 -o "$TMP/rows" "$HERE/qgemm_rows_a8.c" "$ROOT/cpu_ops/qgemm.c" "$ROOT/cpu_ops/qgemm_a8.c" -lm
for round in 1 2 3; do for v in 0 1; do echo "== $([ $v = 1 ] && echo a8 || echo fp32) (round $round)"; OMP_NUM_THREADS=2 "$TMP/rows" $v; done; done
rm -rf "$TMP"
