#!/usr/bin/env bash
# Issue 14's bench with the day's last code (9ed956e: the bandit's back-off judged on estimates and their errors,
# suffix without a corpus, the default configuration): every method with its drafter from assets/ and the
# transformers peers in the same run, engines interleaved pass by pass, batch 1, temperatures 0 and 0.7,
# HumanEval (its first 8 prompts) then the built-in chat set.  Both bench JSONs are filed in the one
# runs.json under humaneval / chat.  To print a saved table: python -c 'import json,sys;
#   json.dump(json.load(open(sys.argv[1]))[sys.argv[2]], sys.stdout)' runs.json chat > /tmp/chat.json &&
#   hyspec bench --readme-table /tmp/chat.json
set -euo pipefail
OUT=docs/results/2026-12-05/final-bench
J=$(mktemp -d); trap 'rm -rf "$J"' EXIT
for set in humaneval chat; do
  prompts=(); [ "$set" = chat ] && prompts=(--prompts chat)
  hyspec bench "${prompts[@]}" --methods none,ngram,suffix,draft_model,eagle,eagle3,mtp,dflash,dspark,hybrid \
    --peers hf_generate,hf_prompt_lookup,hf_assisted --interleave \
    --kv-cache-bytes 536870912 --batch-sizes 1 --temperatures 0,0.7 --num-prompts 8 --max-tokens 128 --repeats 1 \
    --no-progress --json "$J/$set.json" --plot "$OUT/plots-$set" | tee "$OUT/$set.txt"
done
python3 -c "
import json, os, sys
runs = {os.path.basename(p)[:-5]: json.load(open(p)) for p in sys.argv[1:]}
open('$OUT/runs.json', 'w').write(json.dumps(dict(sorted(runs.items())), indent=1) + '\\n')" "$J"/*.json
