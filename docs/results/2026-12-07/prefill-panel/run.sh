#!/usr/bin/env bash
# The dequantized-panel prefill kernel and the register-held two-output K-quant tile (bccdb54) against the commit
# before, interleaved in one process, bit for bit compared.
# Usage: bash docs/results/2026-12-07/prefill-panel/run.sh Q4KM.gguf Q5KM.gguf
# (the default model requantized by llama.cpp: scripts/llamacpp_requantize.py DEFAULT OUT --type Q4_K_M / Q5_K_M)
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
HERE=docs/results/2026-12-07/prefill-panel
PY=.venv/bin/python
BASE=${BASE:-bccdb54^}
DEFAULT=$($PY -c "from hyspec.assets import default_model; print(default_model())")
ROWS=1,5,8,16,32,64,112,512
$PY scripts/bench_qgemm_types.py --gguf "$DEFAULT" --rows $ROWS --threads 1 --repeats 5 --baseline "$BASE" \
    --json $HERE/default-kernels.json | tee $HERE/default-kernels.txt
$PY scripts/bench_qgemm_types.py --gguf "$1" --rows $ROWS --threads 1 --repeats 5 --baseline "$BASE" \
    --json $HERE/q4km-kernels.json | tee $HERE/q4km-kernels.txt
$PY scripts/bench_qgemm_types.py --gguf "$2" --rows 16,32,112,512 --threads 1 --repeats 5 --baseline "$BASE" \
    --json $HERE/q5km-kernels.json | tee $HERE/q5km-kernels.txt
for prefill in 112 1024; do
    $PY scripts/bench_cpu_rows.py --baseline "$BASE" --model "$DEFAULT" --prefill $prefill --repeats 7 \
        --json $HERE/default-model-$prefill.json | tee $HERE/default-model-$prefill.txt
    $PY scripts/bench_cpu_rows.py --baseline "$BASE" --model "$1" --prefill $prefill --repeats 7 \
        --json $HERE/q4km-model-$prefill.json | tee $HERE/q4km-model-$prefill.txt
done
