#!/usr/bin/env bash
# The a8 layout in about the GGUF's bytes (issue 51): bits and kernel times against BASE, the engine on both
# kernels alternately, then a8 beside llama.cpp on SmolLM2's Q4_K_M and the 7B-shaped Q4_K_M.  Needs AVX-512 VNNI.
#
#     LLAMACPP_PY=$(bash ../shared/tools/llamacpp-venv.sh) bash docs/results/2026-12-07/a8-compact-layout/run.sh [WORK]
#
# WORK holds (or gets) the Q4_K_M files of ../a8-k-quants/run.sh.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
HERE=docs/results/2026-12-07/a8-compact-layout
WORK=${1:-/tmp/a8-k-quants}
BASE=a502da1  # the last commit with the previous layout
LLAMACPP_PY=${LLAMACPP_PY:?set LLAMACPP_PY to a Python with llama-cpp-python}
export TORCH_DEVICE_BACKEND_AUTOLOAD=0
DEFAULT=$(.venv/bin/python -c "from hyspec.assets import default_model; print(default_model())")
Q4KM=$WORK/SmolLM2-135M-Instruct.Q4_K_M.gguf
SEVEN=$WORK/7b-q4km.gguf
mkdir -p "$WORK"
[ -f "$Q4KM" ] || "$LLAMACPP_PY" scripts/llamacpp_requantize.py "$DEFAULT" "$Q4KM" --type Q4_K_M
[ -f "$SEVEN" ] || { .venv/bin/python scripts/make_7b_shaped_gguf.py "$WORK/7b-f16.gguf" --layers 4 &&
  "$LLAMACPP_PY" scripts/llamacpp_requantize.py "$WORK/7b-f16.gguf" "$SEVEN" --type Q4_K_M; }
lscpu | grep -E "^Model name|^CPU\(s\)"; grep -m2 -E "^(cpu family|model)\s" /proc/cpuinfo | tr -s '\t ' ' '
echo "== kernel A/B: $(date -u +%H:%M:%S)"
.venv/bin/python $HERE/kernel_ab.py $BASE | tee $HERE/kernel-zen4.txt
echo "== engine A/B: $(date -u +%H:%M:%S)"
bash $HERE/engine_ab.sh $BASE "$DEFAULT" "$Q4KM" "$SEVEN" | tee $HERE/engine-ab-zen4.txt
run() {  # name, then that run's options
  local name=$1; shift
  echo "== $name: $(date -u +%H:%M:%S)"
  .venv/bin/hyspec bench "$@" --json "$HERE/$name.json" | tee "$HERE/$name.txt"
}
COMMON=(--batch-sizes 1 --num-prompts 8 --max-tokens 48 --repeats 2 --interleave --no-progress --allow-mismatch
        --quantization a8 --methods none,suffix,hybrid --peers llamacpp,llamacpp_prompt_lookup
        --llamacpp-python "$LLAMACPP_PY")
run q4km-a8-humaneval --model "$Q4KM" "${COMMON[@]}" --prefill-tokens 1024
run q4km-a8-chat --model "$Q4KM" "${COMMON[@]}" --workload chat
run 7b-a8 --model "$SEVEN" --quantization a8 --methods none --batch-sizes 1 --num-prompts 8 --max-tokens 32 \
    --repeats 2 --no-progress --allow-mismatch --prefill-tokens 512 --peers llamacpp --llamacpp-python "$LLAMACPP_PY"
echo "done $(date -u +%H:%M:%S)"
