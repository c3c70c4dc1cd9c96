#!/usr/bin/env bash
# A "7B-shaped" Q4_K_M file (Llama-2-7B's layer for 4 layers, random weights, requantized by llama.cpp itself), where
# K-quants are nearly every matrix: the kernels per type before the few-rows (cd4f77c) and two-output tile (e66fcc9)
# changes and after them, then hyspec
# plain beside llama.cpp plain at batch 1 (and hyspec at batch 8), with the prefill of a 512-token prompt.
#
#     LLAMACPP_PY=$(bash ../shared/tools/llamacpp-venv.sh) bash docs/results/2026-12-07/7b-shaped-q4km/run.sh [WORK]
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
HERE=docs/results/2026-12-07/7b-shaped-q4km
WORK=${1:-/tmp/7b-shaped}
LLAMACPP_PY=${LLAMACPP_PY:?set LLAMACPP_PY to a Python with llama-cpp-python}
export TORCH_DEVICE_BACKEND_AUTOLOAD=0
mkdir -p "$WORK"
[ -f "$WORK/7b-f16.gguf" ] || .venv/bin/python scripts/make_7b_shaped_gguf.py "$WORK/7b-f16.gguf" --layers 4
[ -f "$WORK/7b-q4km.gguf" ] || "$LLAMACPP_PY" scripts/llamacpp_requantize.py "$WORK/7b-f16.gguf" "$WORK/7b-q4km.gguf" \
    --type Q4_K_M
.venv/bin/python scripts/bench_qgemm_types.py --gguf "$WORK/7b-q4km.gguf" --rows 1,2,4,8,128 --threads 1 --repeats 3 \
    --baseline cd4f77c^ --json $HERE/kernels.json | tee $HERE/kernels.txt
.venv/bin/hyspec bench --model "$WORK/7b-q4km.gguf" --methods none --batch-sizes 1,8 --num-prompts 8 --max-tokens 32 \
    --repeats 2 --peers llamacpp --llamacpp-python "$LLAMACPP_PY" --prefill-tokens 512 --no-progress \
    --allow-mismatch --json $HERE/bench.json | tee $HERE/bench.txt
