#!/usr/bin/env bash
# hyspec's rows (plain, suffix, hybrid at batch 1 / 8 / 32) beside llama.cpp (plain, prompt lookup, batch 1) on the
# default file and on its Q4_K_M requantization by llama.cpp, HumanEval and chat: scripts/bench_peers.sh's
# settings without the vLLM peers (hyspec plain's vLLM ratios stand in docs/results/2026-12-07/peers-zen4).
#   LLAMACPP_PY=/tmp/llamacpp-venv/bin/python bash docs/results/2026-12-07/bench-head/run.sh OUT
# FILES=default (or q4km) runs one file only; Q4KM=PATH reuses a requantized file; A8=1 adds, on the default file at
# batch 1, hyspec with --quantization a8 (llama.cpp's own arithmetic: 8-bit activations, opt-in) beside llama.cpp.
set -euo pipefail
OUT=${1:?output folder}
mkdir -p "$OUT"
export TORCH_DEVICE_BACKEND_AUTOLOAD=0
DEFAULT=$(.venv/bin/python -c "from hyspec.assets import default_model; print(default_model())")
Q4KM=${Q4KM:-$OUT/SmolLM2-135M-Instruct.Q4_K_M.gguf}
[ -f "$Q4KM" ] || "${LLAMACPP_PY:?llama-cpp-python venv}" scripts/llamacpp_requantize.py "$DEFAULT" "$Q4KM" --type Q4_K_M
COMMON=(--llamacpp-python "${LLAMACPP_PY:?llama-cpp-python venv}" --methods none,suffix,hybrid --batch-sizes 1,8,32
        --num-prompts 8 --max-tokens 48 --repeats 2 --interleave --no-progress --allow-mismatch
        --peers llamacpp,llamacpp_prompt_lookup)
for file in ${FILES:-default q4km}; do
  model=$DEFAULT; [ $file = q4km ] && model=$Q4KM
  for workload in humaneval chat; do
    echo "== $file $workload: $(date -u +%H:%M:%S)" >&2
    .venv/bin/hyspec bench "${COMMON[@]}" --model "$model" --workload "$workload" --json "$OUT/$file-$workload.json" \
      --plot "$OUT/plots-$file-$workload" | tee "$OUT/$file-$workload.txt"
  done
done
if [ "${A8:-0}" = 1 ]; then  # the later --batch-sizes 1 overrides COMMON's
  for workload in humaneval chat; do
    echo "== a8 $workload: $(date -u +%H:%M:%S)" >&2
    .venv/bin/hyspec bench "${COMMON[@]}" --model "$DEFAULT" --workload "$workload" \
      --quantization a8 --batch-sizes 1 --json "$OUT/a8-$workload.json" --plot "$OUT/plots-a8-$workload" \
      | tee "$OUT/a8-$workload.txt"
  done
fi
rm -f "$OUT/SmolLM2-135M-Instruct.Q4_K_M.gguf"
