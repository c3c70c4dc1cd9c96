#!/usr/bin/env bash
# Plain decoding (and ngram) per-token CPU time in two trees, interleaved A, B, A, B ... (README.md here).
#   git worktree add /tmp/abA 3925974; git worktree add /tmp/abB 6222772
#   bash docs/results/2026-12-06/plain-ab/run.sh /tmp/abA /tmp/abB [ROUNDS]    # lines to $OUT
# The measuring part is the Python below (one process per tree and mode).
# Each tree is imported from its own files: a directory whose `hyspec` entry links to the tree's core/ goes
# first on PYTHONPATH (as codebase/bench_ab.sh does).
set -euo pipefail
cd "$(dirname "$0")/../../../.."
A=$(cd "${1:?first checkout}" && pwd); B=$(cd "${2:?second checkout}" && pwd); ROUNDS=${3:-3}
OUT=${OUT:-/tmp/plain-ab.txt}
PY=$PWD/.venv/bin/python
declare -A PKG ROOT=([A]=$A [B]=$B)
for t in A B; do
    PKG[$t]=$(mktemp -d); ln -s "${ROOT[$t]}/core" "${PKG[$t]}/hyspec"
    for d in backends npu_ops cuda_ops cpu_ops; do [ -e "${ROOT[$t]}/core/$d" ] || ln -s "../$d" "${ROOT[$t]}/core/$d"; done
done
MEASURE=$(mktemp --suffix .py)
cat > "$MEASURE" <<'PY'
"""Plain decoding's CPU time per token in one tree (PYTHONPATH picks the tree); 1 thread so that the
process's CPU time, not wall time, is the measure: other jobs on the VM change wall time, much less CPU time."""
import json, sys, time, torch
torch.set_num_threads(1)
from hyspec import LLM, SamplingParams
from hyspec.bench.prompts import humaneval_prompts
mode = sys.argv[1]
prompts = humaneval_prompts()[:4]
spec = None if mode == "plain" else {"method": mode}
llm = LLM(speculative_config=spec) if spec else LLM()
p = SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True)
llm.generate(prompts[:1], SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True), use_tqdm=False)
res = []
for rep in range(3):
    for pr in prompts:
        c0, w0 = time.process_time(), time.perf_counter()
        out = llm.generate([pr], p, use_tqdm=False)
        c1, w1 = time.process_time(), time.perf_counter()
        res.append({"cpu_ms_per_tok": 1000 * (c1 - c0) / 64, "wall_ms_per_tok": 1000 * (w1 - w0) / 64})
toks = [list(o.outputs[0].token_ids) for o in llm.generate(prompts, p, use_tqdm=False)]
print(json.dumps({"mode": mode, "runs": res, "tokens": toks}))
PY
for r in $(seq 1 "$ROUNDS"); do for mode in plain ngram; do for t in A B; do
    PYTHONPATH=${PKG[$t]} TORCH_DEVICE_BACKEND_AUTOLOAD=0 "$PY" "$MEASURE" $mode \
        | sed "s/^/$t $r /" >> "$OUT"
done; done; done
