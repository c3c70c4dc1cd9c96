#!/usr/bin/env bash
# Where a decode step goes, before (the layer loop: HYSPEC_DECODER_STACK=0) and after (the decoder stack):
# perf's sampling profile (software clock) of 300 greedy tokens of the default model after a warm-up, and
# the wall tok/s of the same loop.  Needs Debian's linux-perf.
set -euo pipefail
OUT=docs/results/2026-12-03/cpu-vs-llamacpp
LOOP=$OUT/decode_loop.py
for mode in 0 1; do
  name=$([ $mode = 0 ] && echo before-layer-loop || echo after-decoder-stack)
  HYSPEC_DECODER_STACK=$mode perf record -q -F 999 -o /tmp/hyspec-step.perf -- python "$LOOP" 300 > /tmp/hyspec-step.txt 2>/dev/null
  { echo "HYSPEC_DECODER_STACK=$mode: $(tail -1 /tmp/hyspec-step.txt)"
    echo "share of samples by library and symbol (whole process, load included), top 25:"
    perf report -i /tmp/hyspec-step.perf --no-children --sort dso,symbol 2>/dev/null | grep -v '^#' | grep '%' \
      | awk '{printf "  %7s  %-40s %s\n", $1, substr($2, 1, 40), $4}' | head -25 || true
  } > "$OUT/profile-$name.txt"
  cat "$OUT/profile-$name.txt"
done
