#!/usr/bin/env bash
# ../mixed-continuous/run.sh again after the bandit's back-off was judged on estimates and their errors (c239b82).
set -euo pipefail
OUT=docs/results/2026-12-05/mixed-backoff-error
hyspec bench --workload mixed --quantization a8 --methods none,suffix,hybrid --peers none \
  --batch-sizes 1,4,16,32 --max-tokens 96 --num-prompts 32 --repeats 3 --no-progress --batching continuous \
  --interleave --speculative-config-extra '{"suffix_decoding_max_tree_depth": 64}' \
  --json $OUT/bench-mixed-continuous-a8.json --plot $OUT/plots | tee $OUT/bench-mixed-continuous-a8.txt
