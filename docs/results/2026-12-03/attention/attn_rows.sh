#!/usr/bin/env bash
# The attention of 30 layers, one decode row and verification trees, for two builds of paged_attention.c
# (BEFORE: a git revision, default HEAD~; AFTER: the working tree), interleaved, with each output's bits.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd); ROOT=$(git -C "$HERE" rev-parse --show-toplevel); TMP=$(mktemp -d)
BEFORE=${BEFORE:-HEAD~}
mkdir -p "$TMP/before"
for f in paged_attention.c vexp.h hsum16.h bf16.h; do git -C "$ROOT" show "$BEFORE:cpu_ops/$f" > "$TMP/before/$f"; done
gcc -O3 -march=native -fopenmp -std=gnu11 -o "$TMP/before/attn" "$HERE/attn_rows.c" "$TMP/before/paged_attention.c" -lm
gcc -O3 -march=native -fopenmp -std=gnu11 -o "$TMP/after" "$HERE/attn_rows.c" "$ROOT/cpu_ops/paged_attention.c" -lm
for round in 1 2; do
  for ctx in ${CTXS:-150 300 600}; do for T in ${TS:-1 4 13}; do
    echo "before $(OMP_NUM_THREADS=2 "$TMP/before/attn" $ctx $T)"; echo "after  $(OMP_NUM_THREADS=2 "$TMP/after" $ctx $T)"
  done; done
done
rm -rf "$TMP"
