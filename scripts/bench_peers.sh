#!/usr/bin/env bash
# hyspec beside vLLM's CPU build and llama.cpp in one sitting (issue 51's table; issue 46's bench rows): the default
# GGUF and its Q4_K_M requantization by llama.cpp itself, HumanEval and chat, batch 1, 8 and 32.
#
#     LLAMACPP_PY=$(bash ../shared/tools/llamacpp-venv.sh) bash scripts/bench_peers.sh OUT_DIR
#
# Five `hyspec bench` runs, one after another, on a quiet machine:
#   default GGUF, HumanEval and chat: hyspec plain / suffix / hybrid (interleaved among themselves); vLLM plain,
#     ngram, suffix (arctic-inference) and vLLM + hyspec on the same weights dequantized to float32, one engine at
#     a time; llama.cpp plain and prompt lookup on the same file (batch 1: llama-cpp-python decodes one sequence);
#     HumanEval also times the prefill of one 1024-token prompt on each engine;
#   default GGUF, agentic, batch 1: hyspec's rows, vLLM plain, ngram and vLLM + hyspec (issue 46's batch-1 goals);
#   Q4_K_M file, HumanEval and chat: hyspec's rows and llama.cpp's (vLLM has no GGUF K-quant path on CPU here; its
#     rows above are the same model).
# A8=1 adds four runs at batch 1, on the default file and on the Q4_K_M one: hyspec with --quantization a8 (llama.cpp's
#   own arithmetic, 8-bit activations; opt-in) beside llama.cpp plain and prompt lookup, HumanEval and chat.
# Needs: .venv, the vLLM venv (scripts/vllm_venv.sh), llama-cpp-python (never part of hyspec's set-up: building it
# takes ~15 minutes).  Writes OUT_DIR/results.json (the five documents), OUT_DIR/speedup.png and prints the tables.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?usage: bench_peers.sh OUT_DIR}
LLAMACPP_PY=${LLAMACPP_PY:?set LLAMACPP_PY to a Python with llama-cpp-python}
WORK=${WORK:-/tmp/bench-peers-work}
mkdir -p "$OUT" "$WORK"
export TORCH_DEVICE_BACKEND_AUTOLOAD=0
export VLLM_USE_AOT_COMPILE=${VLLM_USE_AOT_COMPILE:-0}  # see docs/results/2026-12-06/vllm-bench/run_full.sh
HYSPEC=.venv/bin/hyspec
VLLM_PY=${VLLM_PY:-$(bash scripts/vllm_venv.sh)}
DEFAULT=$(.venv/bin/python -c "from hyspec.assets import default_model; print(default_model())")
HF=${HF:-$WORK/smollm2-hf}
Q4KM=$WORK/SmolLM2-135M-Instruct.Q4_K_M.gguf
[ -f "$HF/config.json" ] || $HYSPEC export-hf "$HF"
[ -f "$Q4KM" ] || "$LLAMACPP_PY" scripts/llamacpp_requantize.py "$DEFAULT" "$Q4KM" --type Q4_K_M
"$VLLM_PY" -c "import arctic_inference" 2>/dev/null || "$VLLM_PY" -m pip install -q arctic-inference || true

COMMON=(--llamacpp-python "$LLAMACPP_PY" --methods none,suffix,hybrid --batch-sizes 1,8,32 --num-prompts 8
        --max-tokens 48 --repeats 2 --interleave --no-progress --allow-mismatch)
VLLM=(--vllm-python "$VLLM_PY" --vllm-model "$HF" --vllm-dtype float32)
run() {  # name, then that run's options
  local name=$1; shift
  echo "== $name: $(date -u +%H:%M:%S)" >&2
  $HYSPEC bench "${COMMON[@]}" "$@" --json "$WORK/$name.json" --plot "$WORK/plots-$name" | tee "$WORK/$name.txt"
}
ALL_PEERS=vllm,vllm_ngram,vllm_suffix,vllm_hyspec,llamacpp,llamacpp_prompt_lookup
run default-humaneval --model "$DEFAULT" "${VLLM[@]}" --peers $ALL_PEERS --prefill-tokens 1024
run default-chat --model "$DEFAULT" "${VLLM[@]}" --peers $ALL_PEERS --workload chat
# issue 46's batch-1 goals: vLLM + hyspec against vLLM plain and vLLM's ngram on the agentic workload (8 draft tokens
# for every method, so that long copies are not capped at 5 tokens a step)
run default-agentic --model "$DEFAULT" "${VLLM[@]}" --peers vllm,vllm_ngram,vllm_hyspec --workload agentic \
  --batch-sizes 1 --num-speculative-tokens 8
run q4km-humaneval --model "$Q4KM" --peers llamacpp,llamacpp_prompt_lookup --prefill-tokens 1024
run q4km-chat --model "$Q4KM" --peers llamacpp,llamacpp_prompt_lookup --workload chat
if [ "${A8:-0}" = 1 ]; then  # the later --batch-sizes 1 overrides COMMON's
  run a8-humaneval --model "$DEFAULT" --peers llamacpp,llamacpp_prompt_lookup --quantization a8 --batch-sizes 1
  run a8-chat --model "$DEFAULT" --peers llamacpp,llamacpp_prompt_lookup --workload chat --quantization a8 \
    --batch-sizes 1
  run q4km-a8-humaneval --model "$Q4KM" --peers llamacpp,llamacpp_prompt_lookup --quantization a8 --batch-sizes 1
  run q4km-a8-chat --model "$Q4KM" --peers llamacpp,llamacpp_prompt_lookup --workload chat --quantization a8 \
    --batch-sizes 1
fi

.venv/bin/python - "$WORK" "$OUT/results.json" <<'PY'
import json, sys
from pathlib import Path
work, out = Path(sys.argv[1]), Path(sys.argv[2])
names = ("default-humaneval", "default-chat", "default-agentic", "q4km-humaneval", "q4km-chat", "a8-humaneval",
         "a8-chat", "q4km-a8-humaneval", "q4km-a8-chat")
runs = {n: json.loads((work / f"{n}.json").read_text()) for n in names if (work / f"{n}.json").is_file()}
out.write_text(json.dumps({"kind": "hyspec-bench-set", "smoke": False, "runs": runs}, indent=1) + "\n")
PY
cp "$WORK/plots-default-humaneval/speedup.png" "$OUT/speedup.png"
for name in default-humaneval default-chat default-agentic q4km-humaneval q4km-chat a8-humaneval a8-chat \
    q4km-a8-humaneval q4km-a8-chat; do
  [ -f "$WORK/$name.json" ] || continue
  echo "### $name"; $HYSPEC bench --readme-table "$WORK/$name.json"
done
echo "done $(date -u +%H:%M:%S)" >&2
