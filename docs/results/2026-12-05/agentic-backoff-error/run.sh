#!/usr/bin/env bash
# ../agentic-interleaved/run.sh again after the bandit judged its back-off on estimates and their errors
# (c239b82): 16 requests (8 edits of
# embedded stdlib code, then the same 8 again), 96 tokens, T=0, 8-bit activations, suffix tree depth 64,
# median of 3 interleaved passes, batch 1 and 8, transformers' prompt lookup at batch 1.
set -euo pipefail
OUT=docs/results/2026-12-05/agentic-backoff-error
hyspec bench --workload agentic --quantization a8 --methods none,ngram,suffix,hybrid --peers hf_prompt_lookup \
  --batch-sizes 1,8 --max-tokens 96 --num-prompts 16 --repeats 3 --interleave --no-progress \
  --speculative-config-extra '{"suffix_decoding_max_tree_depth": 64}' \
  --json "$OUT/bench-agentic-a8.json" --plot "$OUT/plots" | tee "$OUT/bench-agentic-a8.txt"
