#!/usr/bin/env bash
# A few rows of x against K-quant / Q5_1 blocks (cd4f77c) against the commit before, interleaved in one process.
# Usage: bash docs/results/2026-12-07/kquant-few-rows/run.sh Q4KM.gguf Q5KM.gguf
# (the default model requantized by llama.cpp: scripts/llamacpp_requantize.py DEFAULT OUT --type Q4_K_M / Q5_K_M)
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
HERE=docs/results/2026-12-07/kquant-few-rows
PY=.venv/bin/python
BASE=${BASE:-cd4f77c^}
$PY scripts/bench_qgemm_types.py --gguf "$1" --rows 1,2,3,4,8,16,32,33 --threads 1 --repeats 7 --baseline "$BASE" \
    --json $HERE/q4km-avx512.json | tee $HERE/q4km-avx512.txt
$PY scripts/bench_qgemm_types.py --gguf "$1" --rows 1,2,4,8,16 --threads 1 --repeats 7 --baseline "$BASE" \
    --march haswell --json $HERE/q4km-avx2.json | tee $HERE/q4km-avx2.txt
$PY scripts/bench_qgemm_types.py --gguf "$2" --rows 2,4,8,16,32 --threads 1 --repeats 7 --baseline "$BASE" \
    --json $HERE/q5km-avx512.json | tee $HERE/q5km-avx512.txt
$PY scripts/bench_cpu_rows.py --baseline "$BASE" --model "$1" --batches 1,2,4,8,32 --prefill 0 --repeats 11 \
    | tee $HERE/q4km-decode.txt
