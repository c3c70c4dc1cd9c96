#!/usr/bin/env bash
# run.sh's batch-8 half again after the cost-model fix (8db45f5: each verification step teaches its mean
# tokens per sequence, not its longest feed). Batch 1 is unchanged by that fix (one feed per step).
set -euo pipefail
OUT=docs/results/2026-12-05/issue16-final
for w in humaneval chat agentic mixed; do
  hyspec bench --workload "$w" --quantization a8 --methods none,ngram,suffix,hybrid --peers none \
    --batch-sizes 8 --max-tokens 96 --num-prompts 16 --repeats 3 --interleave --no-progress \
    --speculative-config-extra '{"suffix_decoding_max_tree_depth": 64}' \
    --json "$OUT/$w-bs8-after-fix.json" --plot "$OUT/plots-$w-bs8-after-fix" 2>/dev/null | tee "$OUT/$w-bs8-after-fix.txt"
done
