#!/usr/bin/env bash
# Issue 16's showing with the day's last code: one `hyspec bench` run per workload (humaneval, chat,
# agentic, mixed), batch 1 and 8, T=0, plain / ngram / suffix / the bandit hybrid (+ transformers' prompt
# lookup at batch 1), 16 requests x 96 tokens, 8-bit activations, suffix tree depth 64 (as every
# issue-16 run), engines interleaved, median of 3 passes.
set -euo pipefail
OUT=docs/results/2026-12-05/issue16-final
for w in humaneval chat agentic mixed; do
  hyspec bench --workload "$w" --quantization a8 --methods none,ngram,suffix,hybrid --peers hf_prompt_lookup \
    --batch-sizes 1,8 --max-tokens 96 --num-prompts 16 --repeats 3 --interleave --no-progress \
    --speculative-config-extra '{"suffix_decoding_max_tree_depth": 64}' \
    --json "$OUT/$w.json" --plot "$OUT/plots-$w" 2>/dev/null | tee "$OUT/$w.txt"
done
