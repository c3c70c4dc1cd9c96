"""hyspec's dense_gemm against the MKL / oneDNN packed linears it replaces, on SmolLM2-135M's projection shapes.

    python docs/results/2026-12-02/dense_gemm/bench.py > docs/results/2026-12-02/dense_gemm/bench.txt

Per row count M (1 = decode, 5 / 8 = verification, 64 / 128 = prefill chunks): the time of one layer's seven
projections (q, k, v, o, gate, up, down) times 30 layers, 2 threads, best of 3 repetitions of a timed loop;
the weights are random (cache-resident: this compares compute, not DRAM bandwidth).  Also: the largest
error against float64, and whether a row's result depends on the row count (it must not, for dense_gemm).
"""
import platform
import time

import torch

from hyspec.cpu_ops.dense_gemm import dense_gemm, isa
from hyspec.cpu_ops.packed_linear import _bf16_packing_runs

SHAPES = [(576, 576), (192, 576), (192, 576), (576, 576), (1536, 576), (1536, 576), (576, 1536)]  # (N, K)


def best_of(f, reps, repeat=3):
    f()
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        for _ in range(reps):
            f()
        times.append((time.perf_counter() - t) / reps)
    return min(times)


def packed(weight):
    if weight.dtype == torch.bfloat16:
        p = torch.ops.mkldnn._reorder_linear_weight(weight, 4)
        return lambda x: torch.ops.mkldnn._linear_pointwise(x, p, None, "none", [], "")
    p = torch.ops.mkl._mkl_reorder_linear_weight(weight, 4)
    return lambda x: torch.ops.mkl._mkl_linear(x, p, weight, None, x.shape[0])


def main():
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    print(f"{cpu}, {torch.get_num_threads()} threads, torch {torch.__version__}, dense_gemm isa {isa()}, "
          f"{platform.machine()}")
    torch.manual_seed(0)
    dtypes = [torch.float32] + ([torch.bfloat16] if _bf16_packing_runs() else [])
    print(f"{'dtype':9s} {'M':>4s} {'dense_gemm ms':>14s} {'MKL/oneDNN ms':>14s} {'ratio':>6s} {'max err':>9s} invariant")
    for dtype in dtypes:
        ws = [(torch.randn(n, k) * 0.05).to(dtype) for n, k in SHAPES]
        refs = [packed(w) for w in ws]
        for m in (1, 5, 8, 64, 128):
            xs = [torch.randn(m, w.shape[1]).to(dtype) for w in ws]
            reps = 200 if m <= 8 else 30
            ours = best_of(lambda: [dense_gemm(x, w) for x, w in zip(xs, ws)], reps) * 30
            theirs = best_of(lambda: [r(x) for r, x in zip(refs, xs)], reps) * 30
            err = max(float((dense_gemm(x, w).double() - x.double() @ w.double().T).abs().max()) for x, w in zip(xs, ws))
            w, x = ws[4], xs[4]
            alone = torch.cat([dense_gemm(x[i:i + 1].contiguous(), w) for i in range(m)])
            print(f"{str(dtype)[6:]:9s} {m:4d} {ours * 1e3:14.2f} {theirs * 1e3:14.2f} {ours / theirs:6.2f} {err:9.2e} "
                  f"{torch.equal(dense_gemm(x, w), alone)}")


if __name__ == "__main__":
    main()
