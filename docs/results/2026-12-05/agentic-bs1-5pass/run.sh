#!/usr/bin/env bash
# Issue 16's agentic goal at batch 1 (suffix >= 1.5x ngram), met in one of two 3-pass runs earlier today
# (1.46x, 1.52x): the same command as ../agentic-backoff-error/run.sh at batch 1 with 5 interleaved passes.
set -euo pipefail
OUT=docs/results/2026-12-05/agentic-bs1-5pass
hyspec bench --workload agentic --quantization a8 --methods none,ngram,suffix,hybrid --peers hf_prompt_lookup \
  --batch-sizes 1 --max-tokens 96 --num-prompts 16 --repeats 5 --interleave --no-progress \
  --speculative-config-extra '{"suffix_decoding_max_tree_depth": 64}' \
  --json "$OUT/bench-agentic-a8.json" --plot "$OUT/plots" | tee "$OUT/bench-agentic-a8.txt"
