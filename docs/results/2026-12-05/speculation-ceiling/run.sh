#!/usr/bin/env bash
# The oracle ceiling (ceiling.py) on the issue-16 settings: 16 requests x 96 tokens, a8, T=0, median of 3
# interleaved passes; HumanEval and agentic at batch 1 and 8.  Run from the repository root.
set -euo pipefail
OUT=docs/results/2026-12-05/speculation-ceiling
RUNS=$(mktemp -d)  # one JSON per ceiling.py run, merged into $OUT/ceiling.json at the end
for w in humaneval agentic; do
  for bs in 1 8; do
    .venv/bin/python "$OUT/ceiling.py" --workload "$w" --batch-size "$bs" --num-prompts 16 --max-tokens 96 \
      --ks 1,3,7,15,31 --rounds 3 --out "$RUNS/$w-bs$bs.json" 2>/dev/null
  done
done
# the mixed stream (issue 16's hybrid goal), same settings
for bs in 1 8; do
  .venv/bin/python "$OUT/ceiling.py" --workload mixed --batch-size "$bs" --num-prompts 16 --max-tokens 96 \
    --ks 1,3,7,15,31 --rounds 3 --out "$RUNS/mixed-bs$bs.json" 2>/dev/null
done
# issue 14's bench settings (docs/results/2026-12-05/final-bench): fp32 activations, 8 prompts x 128 tokens, batch 1
for w in humaneval chat; do
  .venv/bin/python "$OUT/ceiling.py" --workload "$w" --quantization none --batch-size 1 --num-prompts 8 \
    --max-tokens 128 --ks 1,3,7,15,31 --rounds 3 --out "$RUNS/$w-fp32-bs1.json" 2>/dev/null
done
.venv/bin/python - "$RUNS" "$OUT/ceiling.json" <<'PY'
import json, sys
from pathlib import Path
runs = sorted(Path(sys.argv[1]).glob("*.json"))
Path(sys.argv[2]).write_text(json.dumps({p.stem: json.loads(p.read_text()) for p in runs}, indent=1) + "\n")
PY
rm -rf "$RUNS"
# the same through `hyspec bench --ceiling` (agentic, batch 1 and 8, with ngram, suffix and transformers' prompt lookup)
hyspec bench --workload agentic --quantization a8 --methods none,ngram,suffix --peers hf_prompt_lookup \
  --batch-sizes 1,8 --max-tokens 96 --num-prompts 16 --repeats 3 --interleave --no-progress --ceiling 7,31 \
  --speculative-config-extra '{"suffix_decoding_max_tree_depth": 64}' --json "$OUT/bench-agentic.json" \
  2>/dev/null | tee "$OUT/bench-agentic.txt"
