#!/usr/bin/env bash
# The recipe of the drafters in assets/ for the default model (SmolLM2-135M-Instruct): see assets/DRAFTERS.md.
#
#   bash scripts/train_default_drafters.sh eagle3        # one method; rerun the same line to resume
#   INIT=assets/smollm2-eagle3 STEPS=300 LR=5e-4 bash scripts/train_default_drafters.sh eagle3
#                                                         # continue the committed drafter on another machine
#
# Every step resumes: the prompts are a pure function of the seed and this Python's stdlib, the target's
# answers are cached chunk by chunk in $WORK/selfgen.pt (shared by every method), and train-draft
# resumes from its last checkpoint (--resume).  Nothing here reads HumanEval, the benchmark.
set -euo pipefail
METHOD=${1:?usage: train_default_drafters.sh METHOD}
WORK=${WORK:-.bench-work/drafter-data}
PROMPTS=${PROMPTS:-1024}       # prompts answered by the target (half greedy, half sampled at 0.7)
mkdir -p "$WORK"
[ -f "$WORK/prompts.jsonl" ] || python scripts/build_drafter_prompts.py --count 3000 --seed 0 --out "$WORK/prompts.jsonl"

common=(--self-generate-prompts "$WORK/prompts.jsonl" --self-generate "$PROMPTS" --self-generate-temperature 0,0.7
        --self-generate-cache "$WORK/selfgen.pt" --seq-len 320 --prompt-len 192 --target-dtype float32
        --holdout 32 --cache-hidden --checkpoint-every 20 --log-every 5 --resume
        --work-dir "$WORK/$METHOD.partial" --out "assets/smollm2-${METHOD//_/-}" ${INIT:+--init-from "$INIT"})
case "$METHOD" in
  eagle3)
    exec hyspec train-draft --method eagle3 "${common[@]}" --steps "${STEPS:-140}" --batch-size 8 --lr "${LR:-1e-3}" \
      --option draft_vocab_size=8192 --option ttt_steps=4 --option storage=int8 ;;
  mtp)
    exec hyspec train-draft --method mtp "${common[@]}" --steps "${STEPS:-400}" --batch-size 8 --lr "${LR:-1e-3}" \
      --option num_modules=1 --option storage=int8 ;;
  eagle)
    exec hyspec train-draft --method eagle "${common[@]}" --steps "${STEPS:-200}" --batch-size 8 --lr "${LR:-1e-3}" \
      --option storage=int8 ;;
  dflash|dspark)
    # One backbone layer: a block of 8 slots is one forward, and on a CPU each layer of it costs like a
    # verified row.  DSpark adds its Markov head (rank 32) and confidence head.
    exec hyspec train-draft --method "$METHOD" "${common[@]}" --steps "${STEPS:-200}" --batch-size 8 \
      --lr "${LR:-1e-3}" --layers 1 --option storage=int8 ;;
  draft_model)
    # A small independent LM (HF LlamaForCausalLM, transformers' assistant too): 80 wide so that its own
    # 49,152-row embedding (7.9 MB in bf16) and the tokenizer it carries (3.5 MB) fit the 12 MB cap;
    # the embedding starts from the target's embedding seen through its 80 widest directions.
    exec hyspec train-draft --method draft_model "${common[@]}" --steps "${STEPS:-600}" --batch-size 8 \
      --lr "${LR:-2e-3}" --hidden-size 80 --layers 2 --heads 2 --kv-heads 1 --intermediate-size 224 \
      --option embedding_init=target_pca --option storage=bfloat16 ;;
  *)
    echo "no recipe for $METHOD yet (assets/DRAFTERS.md lists what is trained)" >&2; exit 2 ;;
esac
