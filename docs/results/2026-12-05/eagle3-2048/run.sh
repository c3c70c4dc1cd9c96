#!/usr/bin/env bash
# EAGLE-3 head, run 3 (answers to 2,048 prompts instead of 1,024, 600 more steps from the committed head)
# against run 2, the head committed before it: acceptance on HumanEval and chat through `hyspec bench`,
# the goodput controller off (every step drafts the head's default dynamic tree: budget 32, top-k 8,
# depth 4), batch 1, T=0, 8 prompts x 128 tokens (issue 14's bench settings).  OLD / NEW: the two heads.
set -euo pipefail
OUT=docs/results/2026-12-05/eagle3-2048
OLD=${OLD:?the run-2 head} NEW=${NEW:?the run-3 head}
for head in old new; do
  dir=$OLD; [ "$head" = new ] && dir=$NEW
  for set in humaneval chat; do
    prompts=(); [ "$set" = chat ] && prompts=(--prompts chat)
    hyspec bench "${prompts[@]}" --methods none,eagle3 --drafter "eagle3=$dir" --peers none \
      --speculative-config-extra '{"controller": {"enabled": false, "profile_at_startup": false}}' \
      --batch-sizes 1 --temperatures 0 --num-prompts 8 --max-tokens 128 --repeats 1 --no-progress \
      --json "$OUT/$set-$head.json" 2>/dev/null | tee "$OUT/$set-$head.txt"
  done
done
