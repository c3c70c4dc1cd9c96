#!/usr/bin/env bash
# ../mixed-backoff-error/run.sh again after the cost-model fix (8db45f5: ragged verification steps priced by their total rows).
set -euo pipefail
OUT=docs/results/2026-12-05/mixed-cost-model-rows
hyspec bench --workload mixed --quantization a8 --methods none,suffix,hybrid --peers none \
  --batch-sizes 1,4,16,32 --max-tokens 96 --num-prompts 32 --repeats 3 --no-progress --batching continuous \
  --interleave --speculative-config-extra '{"suffix_decoding_max_tree_depth": 64}' \
  --json $OUT/bench-mixed-continuous-a8.json --plot $OUT/plots | tee $OUT/bench-mixed-continuous-a8.txt
