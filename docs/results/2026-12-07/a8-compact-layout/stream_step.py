"""A 7B-shaped decode step's matrices, each its own buffer (4 layers of q, k, v, o, gate|up, down in the Q4_K_M file's
types, then the Q6_K head): one row of x through all of them, best of 7 passes, against the same matrices each called
again at once (as kernel_ab.py times them, where a matrix may stay in the 32 MB L3).

    .venv/bin/python docs/results/2026-12-07/a8-compact-layout/stream_step.py
"""
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))
from hyspec.cpu_ops import qgemm_a8 as a8  # noqa: E402
from tests.test_cpu_ops_kquants import random_blocks  # noqa: E402

torch.set_num_threads(2)
H, F, V = 4096, 11008, 49152
mats = []
for layer in range(4):
    six = layer >= 2  # llama.cpp's Q4_K_M gave layers 2 and 3 a Q6_K v and down
    for qtype, n, k in [("Q4_K", H, H), ("Q4_K", H, H), ("Q6_K" if six else "Q4_K", H, H), ("Q4_K", H, H),
                        ("Q4_K", 2 * F, H), ("Q6_K" if six else "Q4_K", H, F)]:
        raw = torch.as_tensor(np.asarray(random_blocks(qtype, n, k, seed=len(mats)))).reshape(n, -1).to(torch.uint8)
        mats.append((qtype, n, k, a8.pack(qtype, raw, n, k)))
raw = torch.as_tensor(np.asarray(random_blocks("Q6_K", V, H, seed=99))).reshape(V, -1).to(torch.uint8)
mats.append(("Q6_K", V, H, a8.pack("Q6_K", raw, V, H)))
total = sum(m[3].numel() for m in mats)
xs = {k: torch.randn(1, k) for k in (H, F)}
best_step = float("inf")
for _ in range(7):
    t = time.perf_counter()
    for qtype, n, k, p in mats:
        a8.qgemm_a8(qtype, xs[k], p, n)
    best_step = min(best_step, time.perf_counter() - t)
repeated = 0.0  # each matrix on its own, the best of 5 calls in a row
for qtype, n, k, p in mats:
    times = []
    for _ in range(5):
        t = time.perf_counter()
        a8.qgemm_a8(qtype, xs[k], p, n)
        times.append(time.perf_counter() - t)
    repeated += min(times)
print(f"{len(mats)} matrices, {total / 1e6:.0f} MB in the a8 layout")
print(f"one pass over distinct matrices: {best_step * 1e3:.1f} ms, {total / best_step / 1e9:.1f} GB/s")
print(f"each matrix repeated at once:   {repeated * 1e3:.1f} ms, {total / repeated / 1e9:.1f} GB/s")
