#!/usr/bin/env bash
# The drafters with the goodput controller off (every step drafts, EAGLE heads their default dynamic tree:
# budget 32, top-k 8, depth 4): what they would accept and what a drafting step costs on this CPU, which
# the main run cannot show because its controller declined to draft with them.  HumanEval, 4 prompts.
set -euo pipefail
OUT=docs/results/2026-12-05/drafters
hyspec bench --methods none,draft_model,eagle,eagle3,mtp,dflash,dspark --peers none --interleave \
  --speculative-config-extra '{"controller": {"enabled": false, "profile_at_startup": false}}' \
  --kv-cache-bytes 536870912 --batch-sizes 1 --temperatures 0 --num-prompts 4 --max-tokens 128 --repeats 1 \
  --no-progress --json "$OUT/controller-off.json" | tee "$OUT/controller-off.txt"
