#!/usr/bin/env bash
# hyspec against llama.cpp on the default model's own GGUF (SmolLM2-135M-Instruct Q4_1), batch 1, greedy,
# 2 threads, llama.cpp in the same run: HumanEval prompts, then the built-in chat set.  Run from the
# repository root.  PEER_PY: a python with llama-cpp-python (../shared/tools/llamacpp-venv.sh).
#   OUT=DIR            where runs.json and the printed tables go (default: this folder)
#   PREFIX=NAME-       prefix of this run's keys in runs.json (a8-intel's default-path run: PREFIX=default-)
#   QUANTIZATION=a8    hyspec's configurations with 8-bit activations (docs/results/2026-12-04/chat-vs-llamacpp-a8-intel)
#   BF16=1             then dense bf16 plain decoding for its bandwidth fraction (key plain-dense-bf16)
# Each bench's JSON is filed under its key (PREFIX + humaneval / chat) in OUT/runs.json, other keys kept.  To
# print a saved run's table: python -c 'import json,sys; json.dump(json.load(open(sys.argv[1]))[sys.argv[2]],
#   sys.stdout)' OUT/runs.json chat > /tmp/chat.json && hyspec bench --readme-table /tmp/chat.json
set -euo pipefail
OUT=${OUT:-docs/results/2026-12-03/cpu-vs-llamacpp-zen4}
PEER_PY=${PEER_PY:?set PEER_PY to a python that imports llama_cpp}
QUANT=()
SCRATCH=$(mktemp -d); trap 'rm -rf "$SCRATCH"' EXIT
file_into_runs() {  # KEY JSON: add one bench document to OUT/runs.json under KEY
  python3 -c 'import json, os, sys
target, key, doc = sys.argv[1:]
runs = json.load(open(target)) if os.path.exists(target) else {}
runs[key] = json.load(open(doc))
open(target, "w").write(json.dumps(dict(sorted(runs.items())), indent=1) + "\n")' "$OUT/runs.json" "$1" "$2"
}
[ -n "${QUANTIZATION:-}" ] && QUANT=(--quantization "$QUANTIZATION")
for set in humaneval chat; do
  prompts=(); [ "$set" = chat ] && prompts=(--prompts chat)
  hyspec bench "${prompts[@]}" "${QUANT[@]}" --methods none,ngram,suffix,eagle3,hybrid --peers llamacpp,llamacpp_prompt_lookup \
    --llamacpp-python "$PEER_PY" --batch-sizes 1 --temperatures 0 --num-prompts 6 --max-tokens 128 --repeats 2 \
    --no-progress --json "$SCRATCH/$set.json" | tee "$OUT/${PREFIX:-}$set.txt"
  file_into_runs "${PREFIX:-}$set" "$SCRATCH/$set.json"
done
[ -z "${BF16:-}" ] && exit 0
hyspec bench --prompts chat --quantization none --dtype bfloat16 --methods none,ngram --peers llamacpp \
  --llamacpp-python "$PEER_PY" --batch-sizes 1 --temperatures 0 --num-prompts 4 --max-tokens 128 --repeats 2 \
  --no-progress --json "$SCRATCH/bf16.json" | grep -v -E "Warn|WARN" | tee "$OUT/plain-dense-bf16.txt"
file_into_runs plain-dense-bf16 "$SCRATCH/bf16.json"
