"""Microseconds per greedy call on fp32 logits over the default model's 49,152-token vocabulary: the guarded torch
argmax (before) against core/ops/sampling.py greedy (numpy's argmax, after); ids compared.

    .venv/bin/python docs/results/2026-12-07/greedy-argmax/micro.py
"""
import time
import torch
from hyspec.ops.sampling import greedy, guard_logits

def before(logits):
    return guard_logits(logits).argmax(dim=-1)

def per_call(f, x, n=2000):
    for _ in range(100):
        f(x)
    t = time.perf_counter()
    for _ in range(n):
        f(x)
    return 1e6 * (time.perf_counter() - t) / n

print(f"torch threads {torch.get_num_threads()}")
for rows in (1, 5, 8, 32, 160):
    x = torch.randn(rows, 49152, generator=torch.Generator().manual_seed(rows))
    assert torch.equal(before(x), greedy(x))
    b = min(per_call(before, x) for _ in range(3))
    a = min(per_call(greedy, x) for _ in range(3))
    print(f"{rows:4d} rows: before {b:8.1f} us, after {a:7.1f} us ({b / a:.1f}x)")
