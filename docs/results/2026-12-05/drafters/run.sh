#!/usr/bin/env bash
# The bench runs behind assets/DRAFTERS.md's figures (issue 14): the default model with its default numerics
# (fp32 over the GGUF's Q4_1/Q8_0 blocks), batch 1, temperature 0 and 0.7, every method with its drafter from
# assets/ and the transformers peers (generate, prompt lookup, assisted generation with the draft_model
# drafter) in the same run, engines interleaved pass by pass (each with a 512 MiB KV pool: ten engines live at once); HumanEval (8 prompts), then the built-in chat set.
set -euo pipefail
OUT=docs/results/2026-12-05/drafters
for set in humaneval chat; do
  prompts=(); [ "$set" = chat ] && prompts=(--prompts chat)
  hyspec bench "${prompts[@]}" --methods none,ngram,suffix,draft_model,eagle,eagle3,mtp,dflash,dspark,hybrid \
    --peers hf_generate,hf_prompt_lookup,hf_assisted --interleave \
    --kv-cache-bytes 536870912 --batch-sizes 1 --temperatures 0,0.7 --num-prompts 8 --max-tokens 128 --repeats 1 --no-progress \
    --json "$OUT/$set.json" --plot "$OUT/plots-$set" | tee "$OUT/$set.txt"
done
