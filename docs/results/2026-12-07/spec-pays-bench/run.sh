#!/usr/bin/env bash
# hyspec's own rows (plain, suffix, hybrid at batch 1 / 8 / 32) beside llama.cpp (plain, prompt lookup, batch 1) on
# the default file, HumanEval and chat: the settings of scripts/bench_peers.sh without the vLLM peers.
#   LLAMACPP_PY=/tmp/llamacpp-venv/bin/python bash docs/results/2026-12-07/spec-pays-bench/run.sh OUT
set -euo pipefail
OUT=${1:?output folder}
mkdir -p "$OUT"
DEFAULT=$(.venv/bin/python -c "from hyspec.assets import default_model; print(default_model())")
COMMON=(--llamacpp-python "${LLAMACPP_PY:?llama-cpp-python venv}" --methods none,suffix,hybrid --batch-sizes 1,8,32
        --num-prompts 8 --max-tokens 48 --repeats 2 --interleave --no-progress --allow-mismatch
        --model "$DEFAULT" --peers llamacpp,llamacpp_prompt_lookup)
for workload in humaneval chat; do
  echo "== $workload: $(date -u +%H:%M:%S)" >&2
  .venv/bin/hyspec bench "${COMMON[@]}" --workload "$workload" --json "$OUT/$workload.json" --plot "$OUT/plots-$workload" \
    | tee "$OUT/$workload.txt"
done
