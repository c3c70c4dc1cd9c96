#!/usr/bin/env bash
# After the L2 prefetch (c44efb6): a8 beside llama.cpp on the 7B-shaped Q4_K_M and on SmolLM2's Q4_K_M (HumanEval),
# the same commands as run.sh's.
#
#     LLAMACPP_PY=... bash docs/results/2026-12-07/a8-compact-layout/after_l2.sh [WORK]
source "$(dirname "$0")/common.sh" "$@"
echo "== 7b-a8-l2: $(date -u +%H:%M:%S)"
.venv/bin/hyspec bench --model "$WORK/7b-q4km.gguf" --quantization a8 --methods none --batch-sizes 1 --num-prompts 8 \
    --max-tokens 32 --repeats 2 --no-progress --allow-mismatch --prefill-tokens 512 --peers llamacpp \
    --llamacpp-python "$LLAMACPP_PY" --json $HERE/7b-a8-l2.json | tee $HERE/7b-a8-l2.txt
echo "== q4km-a8-humaneval-l2: $(date -u +%H:%M:%S)"
.venv/bin/hyspec bench --model "$WORK/SmolLM2-135M-Instruct.Q4_K_M.gguf" --quantization a8 --methods none,suffix,hybrid \
    --batch-sizes 1 --num-prompts 8 --max-tokens 48 --repeats 2 --interleave --no-progress --allow-mismatch \
    --peers llamacpp,llamacpp_prompt_lookup --llamacpp-python "$LLAMACPP_PY" \
    --json $HERE/q4km-a8-humaneval-l2.json | tee $HERE/q4km-a8-humaneval-l2.txt
echo "done $(date -u +%H:%M:%S)"
