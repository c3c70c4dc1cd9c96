#!/usr/bin/env bash
# max_tokens 8 instead of 3: with max_tokens 3 the verified drafts are one token long (only two tokens are left
# after the prefill), so chains of 4 and trees deeper than 1 never reach the law's tokens.  Here y2 and y3 can
# come from deep inside an accepted chain (noisy self-drafter), a suffix tree, or an EAGLE tree's siblings.
# Run from the repository root: bash docs/results/2026-12-06/g-test/plan_deep.sh
set -uo pipefail
cd "$(git rev-parse --show-toplevel)"
here=docs/results/2026-12-06/g-test
run() { OMP_NUM_THREADS=1 TORCH_DEVICE_BACKEND_AUTOLOAD=0 .venv/bin/python "$here/run.py" --max-tokens 8 "$@" \
  || echo "FAILED: $*"; }
run --method "draft_model (noisy self)@0.1" --setting issue --n 20000 --seed-index 441
run --method suffix --setting issue --n 20000 --seed-index 471
run --method eagle --setting suite --n 20000 --seed-index 491
run --method draft_model --setting issue --n 20000 --seed-index 461
run --method "draft_model (noisy self)@0.03" --setting issue --n 20000 --seed-index 451
run --method "draft_model (noisy self)@0.1" --setting issue --n 20000 --seed-index 442
run --method suffix --setting suite --n 20000 --seed-index 481
