#!/usr/bin/env bash
# The bandit's exploration back-off (hybrid.bandit_max_backoff) on the default model: plain, suffix and the
# hybrid (bandit over every method with a drafter in assets/, plain included), batch 1, temperature 0,
# HumanEval (8 prompts) then the chat set, engines interleaved pass by pass; once with the default back-off
# (64) and once with 1 (every other arm explored in turn, the old rule).  Hybrid / suffix is read within a run.
set -euo pipefail
OUT=docs/results/2026-12-05/hybrid-backoff
for set in humaneval chat; do
  prompts=(); [ "$set" = chat ] && prompts=(--prompts chat)
  for backoff in 64 1; do
    hyspec bench "${prompts[@]}" --methods none,suffix,hybrid --peers none --interleave \
      --speculative-config-extra "{\"hybrid\": {\"bandit_max_backoff\": $backoff}}" \
      --kv-cache-bytes 536870912 --batch-sizes 1 --temperatures 0 --num-prompts 8 --max-tokens 128 --repeats 2 \
      --no-progress --json "$OUT/$set-backoff$backoff.json" | tee "$OUT/$set-backoff$backoff.txt"
  done
done
