"""Microseconds per call, in a loop, of the two host objects every speculative step builds, at a git revision
(before) and in the working tree (after): TreeBatch.from_trees (one 5-node chain; eight ragged chains) and
SamplingTensors.from_params (1, 8, 32 greedy requests).

    .venv/bin/python docs/results/2026-12-07/spec-step-host/micro.py BEFORE_REV
"""
import importlib.util, subprocess, sys, tempfile, time
from pathlib import Path

import torch

from hyspec import SamplingParams
from hyspec.ops import sampling as new_sampling
from hyspec.seam import tree as new_tree


def at_revision(rev: str, path: str, name: str):
    src = subprocess.run(["git", "show", f"{rev}:{path}"], capture_output=True, text=True, check=True).stdout
    f = Path(tempfile.mkdtemp()) / f"{name}.py"
    f.write_text(src)
    spec = importlib.util.spec_from_file_location(name, f)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def us(fn, n=2000):
    for _ in range(100):
        fn()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t) / n * 1e6


rev = sys.argv[1]
old_tree = at_revision(rev, "core/seam/tree.py", "old_tree")
old_sampling = at_revision(rev, "core/ops/sampling.py", "old_sampling")
one = [new_tree.DraftTree.chain(7, [2, 3, 4, 5])]
eight = [new_tree.DraftTree.chain(7, [2, 3, 4, 5][:k]) for k in (1, 2, 3, 4, 4, 2, 1, 3)]
print(f"before = {rev}, after = working tree; us per call (a loop of 2000 calls after 100 warm-up calls)")
for label, trees in (("TreeBatch.from_trees, one 5-node chain", one), ("TreeBatch.from_trees, 8 ragged chains", eight)):
    old = [old_tree.DraftTree.chain(int(t.tokens[0]), t.tokens[1:].tolist()) for t in trees]
    b = us(lambda: old_tree.TreeBatch.from_trees(old, vocab_size=49152))
    a = us(lambda: new_tree.TreeBatch.from_trees(trees, vocab_size=49152))
    print(f"  {label:42s} {b:7.1f} -> {a:7.1f}")
for n in (1, 8, 32):
    params = [SamplingParams(temperature=0.0, max_tokens=4)] * n
    b = us(lambda: old_sampling.SamplingTensors.from_params(params))
    a = us(lambda: new_sampling.SamplingTensors.from_params(params))
    print(f"  SamplingTensors.from_params, {n:2d} requests      {b:7.1f} -> {a:7.1f}")
