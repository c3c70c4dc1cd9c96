#!/usr/bin/env bash
# SmolLM2's Q5_K_M (requantized by llama.cpp; mostly Q5_1, since 576-wide rows are not whole super-blocks): a8 and
# the exact path beside llama.cpp, HumanEval, batch 1, then perplexity exact against a8 (../a8-k-quants/quality.py).
#
#     LLAMACPP_PY=$(bash ../shared/tools/llamacpp-venv.sh) bash docs/results/2026-12-07/a8-compact-layout/q5km.sh [WORK]
source "$(dirname "$0")/common.sh" "$@"
DEFAULT=$(.venv/bin/python -c "from hyspec.assets import default_model; print(default_model())")
Q5KM=$WORK/SmolLM2-135M-Instruct.Q5_K_M.gguf
[ -f "$Q5KM" ] || "$LLAMACPP_PY" scripts/llamacpp_requantize.py "$DEFAULT" "$Q5KM" --type Q5_K_M
COMMON=(--model "$Q5KM" --batch-sizes 1 --num-prompts 8 --max-tokens 48 --repeats 2 --interleave --no-progress
        --allow-mismatch --methods none,suffix --peers llamacpp --llamacpp-python "$LLAMACPP_PY")
for q in a8 exact; do
  echo "== q5km-$q-humaneval: $(date -u +%H:%M:%S)"
  opts=(); [ $q = a8 ] && opts=(--quantization a8)
  .venv/bin/hyspec bench "${COMMON[@]}" "${opts[@]}" --json $HERE/q5km-$q-humaneval.json | tee $HERE/q5km-$q-humaneval.txt
done
echo "== quality: $(date -u +%H:%M:%S)"
.venv/bin/python docs/results/2026-12-07/a8-k-quants/quality.py "$Q5KM" --json $HERE/quality-q5km-zen4.json > /dev/null
echo "done $(date -u +%H:%M:%S)"
