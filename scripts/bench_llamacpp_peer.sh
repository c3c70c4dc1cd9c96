#!/usr/bin/env bash
# hyspec beside llama.cpp at batch 1 (issue 51): the default GGUF (Q4_1 / Q8_0) and the same model requantized to
# Q4_K_M by llama.cpp's own quantizer, HumanEval and chat, hyspec plain / suffix / hybrid (engines interleaved) and
# llama.cpp plain / prompt lookup on the same file, token ids and thread count, plus the prefill of one 1024-token
# prompt (hyspec plain and llama.cpp plain).  Run from the repository root on a quiet machine:
#
#     LLAMACPP_PY=$(bash ../shared/tools/llamacpp-venv.sh) bash scripts/bench_llamacpp_peer.sh OUT_DIR
#
# llama-cpp-python compiles llama.cpp (~15 min on 2 cores), so it is never part of hyspec's own set-up.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?usage: bench_llamacpp_peer.sh OUT_DIR}
LLAMACPP_PY=${LLAMACPP_PY:?set LLAMACPP_PY to a Python with llama-cpp-python}
mkdir -p "$OUT"
export TORCH_DEVICE_BACKEND_AUTOLOAD=0
DEFAULT=$(.venv/bin/python -c "from hyspec.assets import default_model; print(default_model())")
Q4KM="$OUT/SmolLM2-135M-Instruct.Q4_K_M.gguf"
[ -f "$Q4KM" ] || "$LLAMACPP_PY" scripts/llamacpp_requantize.py "$DEFAULT" "$Q4KM" --type Q4_K_M
COMMON=(--llamacpp-python "$LLAMACPP_PY" --peers llamacpp,llamacpp_prompt_lookup --methods none,suffix,hybrid
        --batch-sizes 1 --num-prompts 8 --max-tokens 48 --repeats 3 --interleave --no-progress --allow-mismatch)
for model in default q4km; do
  file=$DEFAULT; [ $model = q4km ] && file=$Q4KM
  for workload in humaneval chat; do
    echo "== $model $workload $(date -u +%H:%M:%S)" >&2
    extra=(); [ $workload = chat ] && extra=(--workload chat)
    [ $workload = humaneval ] && extra=(--prefill-tokens 1024)
    .venv/bin/hyspec bench --model "$file" "${COMMON[@]}" "${extra[@]}" --json "$OUT/$model-$workload.json" \
      | tee "$OUT/$model-$workload.txt"
  done
done
rm -f "$Q4KM"
echo "done $(date -u +%H:%M:%S)" >&2
