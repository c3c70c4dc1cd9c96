#!/usr/bin/env bash
# The one-row block kernel against memory bandwidth, and three bit-identical reformulations of its AVX-512 path
# (plus one timing-only bound), each built from cpu_ops/qgemm.c at REV with a patch from this folder, interleaved.
#   bash docs/results/2026-12-07/one-row-bound/run.sh [REV] > OUT.txt      (AVX-512 machines only)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(git -C "$here" rev-parse --show-toplevel)
rev=${1:-HEAD}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
build() { # name [patch]
    mkdir -p "$work/$1/cpu_ops"
    for f in qgemm.c kquants.c hsum16.h; do git -C "$repo" show "$rev:cpu_ops/$f" > "$work/$1/cpu_ops/$f"; done
    if [ $# -gt 1 ]; then (cd "$work/$1" && patch -s -p1 < "$here/$2"); fi
    gcc -O3 -march=native -fopenmp -DQGEMM_C="\"$work/$1/cpu_ops/qgemm.c\"" "$here/one_row.c" -o "$work/$1/one_row"
}
build base
build scales_from_memory scales-from-memory.patch
build codes_converted codes-converted.patch
build q5_0_sixteen q5_0-sixteen-entry-table.patch
build scales_constant scales-constant-timing-only.patch
gcc -O3 -march=native -fopenmp "$here/read_bandwidth.c" -o "$work/read_bandwidth"
lscpu | grep -E "^Model name|^CPU\(s\)" ; grep -m2 -E "^(cpu family|model)\s" /proc/cpuinfo | tr -s '\t ' ' '
echo "rev $(git -C "$repo" rev-parse --short "$rev")"
for threads in 1 2; do
    echo "== memory read, $threads thread(s)"
    OMP_NUM_THREADS=$threads "$work/read_bandwidth" 400000000 | tail -2
done
for round in 1 2 3; do
    echo "== round $round (Q4_1 = qtype 1, Q5_0 = qtype 3; 576 x 1536, one row of x)"
    for v in base scales_from_memory codes_converted scales_constant; do
        for mats in 1 100; do printf '%-20s 1 thread  ' $v; OMP_NUM_THREADS=1 "$work/$v/one_row" 1 576 1536 $mats 1; done
    done
    for v in base q5_0_sixteen; do printf '%-20s 1 thread  ' $v; OMP_NUM_THREADS=1 "$work/$v/one_row" 3 576 1536 100 1; done
    for v in base; do
        for mats in 1 100; do printf '%-20s 2 threads ' $v; OMP_NUM_THREADS=2 "$work/$v/one_row" 1 576 1536 $mats 1; done
    done
done
