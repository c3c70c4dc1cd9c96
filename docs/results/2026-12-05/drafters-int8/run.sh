#!/usr/bin/env bash
# ../drafters/run.sh again at temperature 0 after this session's changes (drafters on int8 kernels, DSpark's
# sort, the bandit's back-off and depth-4 EAGLE trees in the hybrid): every method with its drafter from
# assets/ and the transformers peers in the same run, engines interleaved pass by pass, batch 1,
# HumanEval (8 prompts) then the built-in chat set.
set -euo pipefail
OUT=docs/results/2026-12-05/drafters-int8
for set in humaneval chat; do
  prompts=(); [ "$set" = chat ] && prompts=(--prompts chat)
  hyspec bench "${prompts[@]}" --methods none,ngram,suffix,draft_model,eagle,eagle3,mtp,dflash,dspark,hybrid \
    --peers hf_generate,hf_prompt_lookup,hf_assisted --interleave \
    --kv-cache-bytes 536870912 --batch-sizes 1 --temperatures 0 --num-prompts 8 --max-tokens 128 --repeats 1 --no-progress \
    --json "$OUT/$set.json" --plot "$OUT/plots-$set" | tee "$OUT/$set.txt"
done
