#!/usr/bin/env bash
# Issue 16's showing with the day's last code: one `hyspec bench` run per workload (humaneval, chat,
# agentic, mixed), batch 1 and 8, T=0, plain / ngram / suffix / the bandit hybrid (+ transformers' prompt
# lookup at batch 1), 16 requests x 96 tokens, 8-bit activations, suffix tree depth 64 (as every
# issue-16 run), engines interleaved, median of 3 passes -> <workload>.json.
# PART=bs8-after-fix: the batch-8 half again after the cost-model fix (8db45f5: each verification step
# teaches its mean tokens per sequence, not its longest feed; batch 1 is unchanged by that fix, one feed per
# step) -> <workload>-bs8-after-fix.json.  `hyspec bench --readme-table FILE.json` prints a run's table.
set -euo pipefail
OUT=docs/results/2026-12-05/issue16-final
for w in humaneval chat agentic mixed; do
  if [ "${PART:-}" = bs8-after-fix ]; then
    args=(--peers none --batch-sizes 8); out="$OUT/$w-bs8-after-fix"
  else
    args=(--peers hf_prompt_lookup --batch-sizes 1,8); out="$OUT/$w"
  fi
  hyspec bench --workload "$w" --quantization a8 --methods none,ngram,suffix,hybrid "${args[@]}" \
    --max-tokens 96 --num-prompts 16 --repeats 3 --interleave --no-progress \
    --speculative-config-extra '{"suffix_decoding_max_tree_depth": 64}' \
    --json "$out.json" 2>/dev/null | tee "$out.txt"
done
