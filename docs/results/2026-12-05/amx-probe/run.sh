#!/usr/bin/env bash
# Build and run the AMX probe (needs an AMX-INT8 CPU and Linux >= 5.16 for the tile-data permission).
set -euo pipefail
cd "$(dirname "$0")"
gcc -O3 -march=native -fopenmp amx_probe.c -o /tmp/amx_probe -lm
OMP_NUM_THREADS=2 /tmp/amx_probe | tee probe.txt
