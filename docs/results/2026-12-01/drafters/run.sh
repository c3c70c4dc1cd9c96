#!/usr/bin/env bash
# The bench runs behind assets/DRAFTERS.md's figures: the default model, batch 1, greedy, every method with
# a trained drafter and the transformers peers in the same run; HumanEval, then the built-in chat set.
set -euo pipefail
OUT=docs/results/2026-12-01/drafters
for set in humaneval chat; do
  prompts=(); [ "$set" = chat ] && prompts=(--prompts chat)
  hyspec bench "${prompts[@]}" --methods none,ngram,eagle3,hybrid --peers hf_generate,hf_prompt_lookup \
    --batch-sizes 1 --temperatures 0 --num-prompts 8 --max-tokens 128 --repeats 1 --no-progress \
    --json "$OUT/$set.json" --plot "$OUT/plots-$set" | tee "$OUT/$set.txt"
done
