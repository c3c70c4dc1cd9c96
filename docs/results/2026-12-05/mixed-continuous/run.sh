#!/usr/bin/env bash
# docs/results/2026-12-04/mixed-continuous-interleaved/ again with this session's hybrid (the bandit's back-off;
# the bench's hybrid is the bandit over ngram, suffix and all six drafters, which now run on int8 kernels).
set -euo pipefail
OUT=docs/results/2026-12-05/mixed-continuous
hyspec bench --workload mixed --quantization a8 --methods none,suffix,hybrid --peers none \
  --batch-sizes 1,4,16,32 --max-tokens 96 --num-prompts 32 --repeats 3 --no-progress --batching continuous \
  --interleave --speculative-config-extra '{"suffix_decoding_max_tree_depth": 64}' \
  --json $OUT/bench-mixed-continuous-a8.json --plot $OUT/plots | tee $OUT/bench-mixed-continuous-a8.txt
