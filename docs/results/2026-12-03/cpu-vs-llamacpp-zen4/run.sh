#!/usr/bin/env bash
# hyspec against llama.cpp on the default model's own GGUF (SmolLM2-135M-Instruct Q4_1), batch 1, greedy,
# 2 threads, llama.cpp in the same run: HumanEval prompts, then the built-in chat set.  Run from the
# repository root.  PEER_PY: a python with llama-cpp-python (../shared/tools/llamacpp-venv.sh).
#   OUT=DIR            where the JSON and printed tables go (default: this folder)
#   QUANTIZATION=a8    hyspec's configurations with 8-bit activations (docs/results/2026-12-04/chat-vs-llamacpp-a8-intel)
#   BF16=1             then dense bf16 plain decoding for its bandwidth fraction (plain-dense-bf16.*)
# `hyspec bench --readme-table OUT/SET.json` prints a saved run's table again.
set -euo pipefail
OUT=${OUT:-docs/results/2026-12-03/cpu-vs-llamacpp-zen4}
PEER_PY=${PEER_PY:?set PEER_PY to a python that imports llama_cpp}
QUANT=()
[ -n "${QUANTIZATION:-}" ] && QUANT=(--quantization "$QUANTIZATION")
for set in humaneval chat; do
  prompts=(); [ "$set" = chat ] && prompts=(--prompts chat)
  hyspec bench "${prompts[@]}" "${QUANT[@]}" --methods none,ngram,suffix,eagle3,hybrid --peers llamacpp,llamacpp_prompt_lookup \
    --llamacpp-python "$PEER_PY" --batch-sizes 1 --temperatures 0 --num-prompts 6 --max-tokens 128 --repeats 2 \
    --no-progress --json "$OUT/$set.json" | tee "$OUT/$set.txt"
done
[ -z "${BF16:-}" ] && exit 0
hyspec bench --prompts chat --quantization none --dtype bfloat16 --methods none,ngram --peers llamacpp \
  --llamacpp-python "$PEER_PY" --batch-sizes 1 --temperatures 0 --num-prompts 4 --max-tokens 128 --repeats 2 \
  --no-progress --json "$OUT/plain-dense-bf16.json" | grep -v -E "Warn|WARN" | tee "$OUT/plain-dense-bf16.txt"
