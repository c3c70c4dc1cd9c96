#!/usr/bin/env bash
# quantization="a8" on K-quant files (Q5_0, Q5_1, Q4_K, Q5_K and Q6_K blocks times 8-bit activations): speed beside
# llama.cpp on the same files, and quality against the exact path.  Needs AVX-512 VNNI and llama-cpp-python.
#
#     LLAMACPP_PY=$(bash ../shared/tools/llamacpp-venv.sh) bash docs/results/2026-12-07/a8-k-quants/run.sh [WORK]
#
# 1. SmolLM2's Q4_K_M (requantized by llama.cpp): hyspec a8 plain / suffix / hybrid beside llama.cpp plain and
#    prompt lookup, then the same for hyspec's exact path, batch 1, HumanEval (and a 1024-token prefill) and chat.
# 2. The 7B-shaped Q4_K_M (docs/results/2026-12-07/7b-shaped-q4km): hyspec a8 beside llama.cpp, then exact beside
#    llama.cpp, batch 1, and a 512-token prefill.
# 3. a8 against exact interleaved in one process (interleaved.py), on both files, and on SmolLM2's Q5_K_M.
# 4. Perplexity, exact against a8, on the SmolLM2 Q4_K_M file (quality.py).
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
HERE=docs/results/2026-12-07/a8-k-quants
WORK=${1:-/tmp/a8-k-quants}
LLAMACPP_PY=${LLAMACPP_PY:?set LLAMACPP_PY to a Python with llama-cpp-python}
export TORCH_DEVICE_BACKEND_AUTOLOAD=0
mkdir -p "$WORK"
DEFAULT=$(.venv/bin/python -c "from hyspec.assets import default_model; print(default_model())")
Q4KM=$WORK/SmolLM2-135M-Instruct.Q4_K_M.gguf
Q5KM=$WORK/SmolLM2-135M-Instruct.Q5_K_M.gguf
[ -f "$Q4KM" ] || "$LLAMACPP_PY" scripts/llamacpp_requantize.py "$DEFAULT" "$Q4KM" --type Q4_K_M
[ -f "$Q5KM" ] || "$LLAMACPP_PY" scripts/llamacpp_requantize.py "$DEFAULT" "$Q5KM" --type Q5_K_M
[ -f "$WORK/7b-f16.gguf" ] || .venv/bin/python scripts/make_7b_shaped_gguf.py "$WORK/7b-f16.gguf" --layers 4
[ -f "$WORK/7b-q4km.gguf" ] || "$LLAMACPP_PY" scripts/llamacpp_requantize.py "$WORK/7b-f16.gguf" "$WORK/7b-q4km.gguf" \
    --type Q4_K_M
lscpu | grep -E "^Model name|^CPU\(s\)"; grep -m2 -E "^(cpu family|model)\s" /proc/cpuinfo | tr -s '\t ' ' '
COMMON=(--batch-sizes 1 --num-prompts 8 --max-tokens 48 --repeats 2 --interleave --no-progress --allow-mismatch)
PEERS=(--peers llamacpp,llamacpp_prompt_lookup --llamacpp-python "$LLAMACPP_PY")
run() {  # name, then that run's options
  local name=$1; shift
  echo "== $name: $(date -u +%H:%M:%S)"
  .venv/bin/hyspec bench "$@" --json "$HERE/$name.json" | tee "$HERE/$name.txt"
}
run q4km-a8-humaneval --model "$Q4KM" --quantization a8 --methods none,suffix,hybrid "${COMMON[@]}" "${PEERS[@]}" \
    --prefill-tokens 1024
run q4km-exact-humaneval --model "$Q4KM" --methods none,suffix,hybrid "${COMMON[@]}" "${PEERS[@]}" \
    --prefill-tokens 1024
run q4km-a8-chat --model "$Q4KM" --quantization a8 --methods none,suffix,hybrid "${COMMON[@]}" "${PEERS[@]}" \
    --workload chat
run q4km-exact-chat --model "$Q4KM" --methods none,suffix,hybrid "${COMMON[@]}" "${PEERS[@]}" --workload chat
SEVEN=(--methods none --batch-sizes 1 --num-prompts 8 --max-tokens 32 --repeats 2 --no-progress --allow-mismatch
       --prefill-tokens 512)
run 7b-a8 --model "$WORK/7b-q4km.gguf" --quantization a8 "${SEVEN[@]}" --peers llamacpp --llamacpp-python "$LLAMACPP_PY"
run 7b-exact --model "$WORK/7b-q4km.gguf" "${SEVEN[@]}" --peers llamacpp --llamacpp-python "$LLAMACPP_PY"
echo "== interleaved: $(date -u +%H:%M:%S)"
{ for w in humaneval chat; do .venv/bin/python $HERE/interleaved.py "$Q4KM" $w 5 48; done
  .venv/bin/python $HERE/interleaved.py "$WORK/7b-q4km.gguf" humaneval 3 32; } 2>&1 | grep -v "^draft quality" \
    > $HERE/interleaved-zen4.txt
.venv/bin/python $HERE/interleaved.py "$Q5KM" humaneval 5 48 2>&1 | grep -v "^draft quality" > $HERE/interleaved-q5km-zen4.txt
echo "== quality: $(date -u +%H:%M:%S)"
.venv/bin/python $HERE/quality.py "$Q4KM" --json $HERE/quality-q4km-zen4.json > /dev/null
echo "done $(date -u +%H:%M:%S)"
