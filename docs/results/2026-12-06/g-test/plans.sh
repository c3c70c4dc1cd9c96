#!/usr/bin/env bash
# The runs behind results.json, one function per plan, in the order they ran (each added after the one before
# it had shown something; the comment says what).  Seed indexes never repeat across runs (run.py: request i of
# seed index s gets seed s * 1_000_003 + i).
# Run from the repository root:  bash docs/results/2026-12-06/g-test/plans.sh [PLAN ...]
#   PLAN: main extra self noisy big deep deep_repeat dflash (default: all, in that order)
# Each plan's output goes to $here/<plan>.log (not kept in the repository: results.json holds every run).
set -uo pipefail
cd "$(git rev-parse --show-toplevel)"
here=docs/results/2026-12-06/g-test
run() { OMP_NUM_THREADS=1 TORCH_DEVICE_BACKEND_AUTOLOAD=0 .venv/bin/python "$here/run.py" "$@" || echo "FAILED: $*"; }

plan_main() {  # two lanes side by side on the 2-core VM (each lane one process at a time)
  lane_a() {  # draft_model: the issue's setting, three independent runs, the suite's setting, then more for pooling
    run --method draft_model --setting issue --n 20000 --repeats 3 --seed-index 1
    run --method draft_model --setting suite --n 20000 --seed-index 11
    run --method draft_model --setting issue --n 20000 --repeats 5 --seed-index 4
  }
  lane_b() {  # the control (no speculation), then every other method at the suite's PARAMS, 10,000 twice
    run --method plain --setting issue --n 20000 --repeats 5 --seed-index 201
    run --method plain --setting suite --n 20000 --repeats 3 --seed-index 211
    local i=301
    for pass in 0 1; do
      for m in "draft_model (self)" remote eagle eagle3 mtp dflash dspark ngram suffix hybrid; do
        run --method "$m" --setting suite --n 10000 --seed-index $((i + pass))
        i=$((i + 10))
      done
      i=301
    done
  }
  lane_a > "$here/main_a.log" 2>&1 &
  local a=$!
  lane_b > "$here/main_b.log" 2>&1 &
  local b=$!
  wait $a; wait $b
  run --summary > /dev/null
}

plan_extra() {  # the test suite's own seeds (seed index 0): the default tier's first 3,000 at the issue's
  # setting, and the slow tier's 30,000 at the suite's PARAMS in one generate call (--chunk 30000 keeps seeds
  # 0..29999).  (Draft length, dense drafter: run.py --method draft_model+k1 / +k2 / +dense; not run, there
  # was no bias to localise.)
  run --method draft_model --setting issue --n 3000 --seed-index 0
  run --method draft_model --setting suite --n 30000 --chunk 30000 --seed-index 0
  run --self-check --summary > /dev/null
}

plan_self() {  # after draft_model (self)'s first 10,000 gave p = 0.016: more of it, fresh seeds, both settings
  run --method "draft_model (self)" --setting suite --n 20000 --seed-index 305
  run --method "draft_model (self)" --setting issue --n 20000 --seed-index 306
}

plan_noisy() {  # the suite's random drafters are accepted ~4 % (draft_model) or never (eagle): a drafter that
  # is the target plus noise (run.py noisy_self_drafter) is accepted 58 % at scale 0.1 and 87 % at 0.03, so
  # both branches of the rejection sampler carry real mass
  run --method "draft_model (noisy self)@0.1" --setting issue --n 20000 --repeats 3 --seed-index 401
  run --method "draft_model (noisy self)@0.1" --setting suite --n 20000 --seed-index 411
  run --method "draft_model (noisy self)@0.03" --setting issue --n 20000 --seed-index 421
}

plan_big() {  # 100,000 requests each (five generate calls of 20,000), once the load on the shared VM dropped
  run --method draft_model --setting issue --n 100000 --seed-index 31
  run --method "draft_model (noisy self)@0.1" --setting issue --n 100000 --seed-index 431
}

plan_deep() {  # max_tokens 8 instead of 3: y2 and y3 can come from deep inside an accepted chain (noisy
  # self-drafter), a suffix tree, or an EAGLE tree's siblings
  run --max-tokens 8 --method "draft_model (noisy self)@0.1" --setting issue --n 20000 --seed-index 441
  run --max-tokens 8 --method suffix --setting issue --n 20000 --seed-index 471
  run --max-tokens 8 --method eagle --setting suite --n 20000 --seed-index 491
  run --max-tokens 8 --method draft_model --setting issue --n 20000 --seed-index 461
  run --max-tokens 8 --method "draft_model (noisy self)@0.03" --setting issue --n 20000 --seed-index 451
  run --max-tokens 8 --method "draft_model (noisy self)@0.1" --setting issue --n 20000 --seed-index 442
  run --max-tokens 8 --method suffix --setting suite --n 20000 --seed-index 481
}

plan_deep_repeat() {  # after seed index 441 gave y2 p = 0.0029: independent repeats, to see whether p shrinks with n
  run --max-tokens 8 --method "draft_model (noisy self)@0.1" --setting issue --n 20000 --repeats 3 --seed-index 501
  run --max-tokens 8 --method "draft_model (noisy self)@0.1" --setting issue --n 100000 --seed-index 511
}

plan_dflash() {  # dflash's second 10,000 (seed index 352) gave y3 p = 0.009: one more independent 20,000
  run --method dflash --setting suite --n 20000 --seed-index 353
}

plans=("$@")
[ ${#plans[@]} -eq 0 ] && plans=(main extra self noisy big deep deep_repeat dflash)
for p in "${plans[@]}"; do
  if [ "$p" = main ]; then plan_main; else "plan_$p" > "$here/$p.log" 2>&1; fi
done
