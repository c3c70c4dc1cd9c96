#!/usr/bin/env bash
# Issue 16's showing with the day's last code: one `hyspec bench` run per workload (humaneval, chat,
# agentic, mixed), batch 1 and 8, T=0, plain / ngram / suffix / the bandit hybrid (+ transformers' prompt
# lookup at batch 1), 16 requests x 96 tokens, 8-bit activations, suffix tree depth 64 (as every
# issue-16 run), engines interleaved, median of 3 passes -> runs.json["<workload>"].
# PART=bs8-after-fix: the batch-8 half again after the cost-model fix (8db45f5: each verification step
# teaches its mean tokens per sequence, not its longest feed; batch 1 is unchanged by that fix, one feed per
# step) -> runs.json["<workload>-bs8-after-fix"].
# Each bench's JSON is written to a scratch folder, then filed under its name in the one runs.json (entries
# of the other PART are kept). To print a run's table:
#   python -c 'import json,sys; json.dump(json.load(open(sys.argv[1]))[sys.argv[2]], sys.stdout)' \
#     runs.json chat > /tmp/chat.json && hyspec bench --readme-table /tmp/chat.json
set -euo pipefail
OUT=docs/results/2026-12-05/issue16-final
SCRATCH=$(mktemp -d); trap 'rm -rf "$SCRATCH"' EXIT
for w in humaneval chat agentic mixed; do
  if [ "${PART:-}" = bs8-after-fix ]; then
    args=(--peers none --batch-sizes 8); name="$w-bs8-after-fix"
  else
    args=(--peers hf_prompt_lookup --batch-sizes 1,8); name="$w"
  fi
  hyspec bench --workload "$w" --quantization a8 --methods none,ngram,suffix,hybrid "${args[@]}" \
    --max-tokens 96 --num-prompts 16 --repeats 3 --interleave --no-progress \
    --speculative-config-extra '{"suffix_decoding_max_tree_depth": 64}' \
    --json "$SCRATCH/$name.json" 2>/dev/null | tee "$SCRATCH/$name.txt"
done
python3 - "$OUT/runs.json" "$SCRATCH"/*.json <<'PY'
import json, os, sys
target, parts = sys.argv[1], sys.argv[2:]
runs = json.load(open(target)) if os.path.exists(target) else {}
for path in parts:
    runs[os.path.basename(path)[: -len(".json")]] = json.load(open(path))
with open(target, "w") as f:
    json.dump(dict(sorted(runs.items())), f, indent=1)
    f.write("\n")
PY
