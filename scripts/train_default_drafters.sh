#!/usr/bin/env bash
# Train every embedded drafter for the embedded default target, reproducibly.
#
#   scripts/train_default_drafters.sh                      # all six, into assets/default-*
#   METHODS="draft_model eagle" scripts/train_default_drafters.sh
#   THREADS=1 scripts/train_default_drafters.sh            # on a machine other jobs share
#   SMOKE=1 TARGET=/tmp/tiny ASSETS=/tmp/out scripts/train_default_drafters.sh   # 3 steps each, to try the script
#
# Data: 2048 windows of 256 tokens, each a 1-64 token prompt cut from the CPython standard library
# (the target's own training text) followed by the target's GREEDY continuation, generated once by
# hyspec's engine and shared by every method (--self-generate-cache).  Drafters are judged on agreeing
# with the target at temperature 0, so they learn from what the target actually writes.  HumanEval is
# deliberately NOT used: it is the benchmark.
#
# Re-running is safe: a finished drafter is skipped (RETRAIN=1 replaces it), an interrupted one resumes
# from its checkpoint in assets/default-<method>.partial/ (every 50 steps), and the generated data is
# completed rather than regenerated.  Each output appears only when complete.
#
# Step counts: each method is sized for ~12-17 minutes on the 2-core dev box (hence 10-25 minutes
# whether or not the second core is free).  Estimated from CPU seconds per step (time.process_time,
# 1 torch thread, so other jobs on the box do not inflate it) measured with train-draft's trainer and
# each recipe (as of this commit) on a randomly initialised model of the default target's exact shape
# (Llama, hidden 512, 8 layers, 8/4 heads, FFN 1408, vocab 8192, tied embeddings, bf16 weights),
# batch 8 x 256 tokens, bf16 autocast:
#     target forward (no grad)         0.60 s   (saved by --cache-hidden from the 2nd epoch on)
#     draft_model (2 layers x 256)     1.08 s   -> 1500 steps: 256 x 1.08 + 1244 x 0.5  ~ 15 min
#     eagle (1 layer)                  1.18 s   -> 1000 steps: 256 x 1.18 +  744 x 0.6  ~ 12.5 min
#     eagle3 (TTT 7 steps), batch 4    2.49 s   ->  300 steps, all in the 1st epoch     ~ 12.5 min
#     mtp (1 module)                   1.44 s   -> 1000 steps: 256 x 1.44 + 744 x 0.85  ~ 17 min
#     dflash (2 layers, block 8)       3.15 s   ->  250 steps, all in the 1st epoch     ~ 13 min
#     dspark                           4.89 s   ->  160 steps, all in the 1st epoch     ~ 13 min
#     self-generation, once            ~400 generated tokens per CPU second at batch 64
#                                      -> 2048 x ~192 tokens                           ~ 16 min
# Two free cores make each run roughly 1.5x faster.  If a recipe's cost changes, re-measure with
# `--steps 5 --log-every 1` and read seconds_per_step in the output's training_log.json.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-.venv/bin/python}
TARGET=${TARGET:-assets/default-target}
ASSETS=${ASSETS:-assets}
WORK=${WORK:-.train-work/default-drafters}
THREADS=${THREADS:-2}
METHODS=${METHODS:-"draft_model eagle eagle3 mtp dflash dspark"}
SELF_GENERATE=2048
SEQ_LEN=256
PROMPT_LEN=64
if [[ -n "${SMOKE:-}" ]]; then SELF_GENERATE=16; SEQ_LEN=64; PROMPT_LEN=16; fi

if [[ ! -f "$TARGET/config.json" ]]; then
  echo "train_default_drafters: no target model in $TARGET (train it with scripts/train_default_model.py)" >&2
  exit 2
fi
mkdir -p "$WORK"

COMMON=(--target "$TARGET" --data stdlib --seed 0 --seq-len "$SEQ_LEN" --prompt-len "$PROMPT_LEN"
        --self-generate "$SELF_GENERATE" --self-generate-cache "$WORK/self_generated.pt"
        --lr 1e-3 --checkpoint-every 50 --log-every 10 --threads "$THREADS" --resume)

# method -> output folder (hyspec.assets.DRAFTER_DIRS)
declare -A DIRS=([draft_model]=default-draft-model [eagle]=default-eagle [eagle3]=default-eagle3
                 [mtp]=default-mtp [dflash]=default-dflash [dspark]=default-dspark)
# method -> its own arguments (steps and batch size as estimated above; method options)
declare -A ARGS=(
  [draft_model]="--steps 1500 --batch-size 8 --cache-hidden --layers 2 --hidden-size 256"
  [eagle]="--steps 1000 --batch-size 8 --cache-hidden"
  [eagle3]="--steps 300 --batch-size 4"
  [mtp]="--steps 1000 --batch-size 8 --cache-hidden"
  [dflash]="--steps 250 --batch-size 8 --cache-hidden"
  [dspark]="--steps 160 --batch-size 8"
)

for method in $METHODS; do
  if [[ -z "${DIRS[$method]:-}" ]]; then
    echo "train_default_drafters: unknown method $method" >&2
    exit 2
  fi
  out="$ASSETS/${DIRS[$method]}"
  if [[ -f "$out/training_log.json" && -z "${RETRAIN:-}" ]]; then
    echo "== $method: $out is already trained (RETRAIN=1 to replace it)"
    continue
  fi
  read -r -a own <<< "${ARGS[$method]}"
  if [[ -n "${SMOKE:-}" ]]; then own+=(--steps 3); fi
  echo "== $method -> $out"
  "$PY" -m hyspec.cli.main train-draft --method "$method" --out "$out" "${COMMON[@]}" "${own[@]}" \
    ${RETRAIN:+--overwrite}
done
