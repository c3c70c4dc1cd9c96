#!/usr/bin/env bash
# `hyspec bench --quick` on the tree before issue 49's restructuring (a707f76) and after, alternating
# before/after so the VM's drift lands on both, plus plain decoding's tokens from each tree.
#
#   git worktree add /tmp/before a707f76; git worktree add /tmp/after HEAD
#   bash docs/results/2026-12-06/codebase/bench_ab.sh /tmp/before /tmp/after [ROUNDS]
#
# Each tree is imported from its own files: a directory whose `hyspec` entry links to the tree's core/ (with
# its backends/, *_ops/ linked inside, as pyproject's package-dir maps them) goes first on PYTHONPATH.
# Raw runs go to $RAW (default: a temporary directory); bench-ab.json here merges them.
set -euo pipefail
cd "$(dirname "$0")/../../../.."
BEFORE=$(cd "${1:?a checkout of a707f76}" && pwd)
AFTER=$(cd "${2:?a checkout of the commit to compare}" && pwd)
ROUNDS=${3:-2}
HERE=docs/results/2026-12-06/codebase
RAW=${RAW:-$(mktemp -d)}
PY=$PWD/.venv/bin/python
declare -A PKG
for tree in before after; do
    root=$BEFORE; [ $tree = after ] && root=$AFTER
    PKG[$tree]=$(mktemp -d)
    ln -s "$root/core" "${PKG[$tree]}/hyspec"
    for d in backends npu_ops cuda_ops cpu_ops; do [ -e "$root/core/$d" ] || ln -s "../$d" "$root/core/$d"; done
done
run() {  # $1: before|after, $2: round
    local env=(PYTHONPATH="${PKG[$1]}")
    env "${env[@]}" "$PY" -c "import hyspec; assert hyspec.__file__.startswith('${PKG[$1]}'), hyspec.__file__"
    env "${env[@]}" "$PY" -m hyspec.cli.main bench --quick --peers none --no-progress --json "$RAW/$1-$2.json"
    env "${env[@]}" "$PY" "$HERE/bench_ab.py" plain-tokens > "$RAW/$1-plain-tokens.json"
}
for r in $(seq 1 "$ROUNDS"); do
    run before "$r"
    run after "$r"
done
"$PY" "$HERE/bench_ab.py" merge "$RAW" "$HERE/bench-ab.json"
